"""GiGPO vs GRPO (vs HGPO, GraphGPO) at equal budget, on a testbed where step-level credit matters, on a CPU.

    python benchmarks/learning.py                         # headline: corridor, the 10 HEADLINE_SEEDS, all four arms
    python benchmarks/learning.py --quick                 # <= 3-minute smoke version (1 seed, 3 iterations)
    python benchmarks/learning.py --seeds 200 201 202 203 204 --output_dir outputs/bench/learning/a   # a split run
    python benchmarks/learning.py --report_only --runs outputs/bench/learning/a/runs.jsonl \
        outputs/bench/learning/b/runs.jsonl              # merge split runs into one report
    python benchmarks/learning.py --warmup_only --seeds 1 100   # only the warm-ups, with their figures
    python benchmarks/learning.py --arms GiGPO GRPO       # without the HGPO and GraphGPO arms
    python benchmarks/learning.py --arms GraphGPO --reuse_warmup   # add an arm to a run (same output_dir)
    python benchmarks/learning.py --testbed frozenlake4   # the former FrozenLake 4x4 run (smoke option)
    python benchmarks/learning.py --condition clock --iterations 20   # one cell of the map (CONDITIONS, MAP_SEEDS)
    python benchmarks/learning.py --map_report            # the map's table and figure from its cells' results

Testbed ``corridor`` (default): ``gigpo_trl.envs.corridor.CorridorEnv`` with 12 rooms, each with a passage and
a dead end (left/right in random order), ``max_turns`` 30; the shortest episode is 12 turns, reward 1 only for
leaving the last room (plus the trainer's invalid-action penalty). The policy acts through ``DoorCorridor``: it
names the door it walks through (``arch``, ``stairs``: passages; ``closet``, ``niche``: dead ends; ``back`` out of
a dead end) and the benchmark translates that to the env's move, so observations, dynamics, rewards and anchors
are the env's (``--actions moves`` names directions instead). Training uses the env's train ids, evaluation its
disjoint eval ids. The prompt is a compact version of the env's.

Per seed:

1. a tiny Qwen2 policy (random init, compact BPE tokenizer trained offline on the testbed's prompts) gets a
   supervised *legal-move* warm-up (``legal_move_warmup``): real prompts (``gigpo_trl.prompts.build_messages`` +
   the chat template) of states reached by random walks, each with every legal move as a target
   (``<think>go</think><action>{move}</action>``; corridor: both doors of a room, ``back`` in a dead end), i.e.
   cross-entropy against the uniform distribution over the legal moves. Phase 1 runs until >= 95 % of sampled moves
   are legal; phase 2 (learning rate decaying to 0) until the final sampled check also has the passage chosen in
   0.5 +- 0.05 of two-door rooms (the policy knows the rules, not the way). A seed that misses either within
   ``--warmup_max_steps`` stops the run with an error naming it. The weights are saved once; every arm starts from
   them.
2. every arm (``ARMS``; default all four) trains from those weights with identical settings, seed, task
   order and number of iterations; only the arm's config fields differ (GiGPO: omega = 1; GRPO: omega = 0; HGPO:
   the authors' recipe, ``step_grouping="hierarchical"`` with K = 2 and alpha = 1; GraphGPO: the authors' recipe,
   ``step_return="graph"`` with the gamma of its ALFWorld script, 0.10).
3. held-out evaluation (the env's eval split, sampled at T = 1) at iteration 0 and at ``eval_schedule``'s
   iterations (every ``--eval_every_early`` iterations, then the last three ``--eval_every`` apart); greedy too at
   iteration 0 and the last three.

Primary metric (``PRIMARY_METRIC``, fixed before the headline run): per seed and arm, the mean held-out success
over the last 3 evaluations, sampled at T = 1; the paired per-seed gap between arms, its mean and a 95% t interval
over seeds. Second metric: the area under the sampled held-out success curve (``auc``), with its paired interval.
Also greedy success; iterations until the 5-iteration running mean of training success reaches 0.5; the env steps
and generated tokens per arm; the anchor-group statistics early / middle / late; each seed's warm-up figures.
Writes ``learning.json`` and ``learning_curve.png`` to ``--results_dir`` (default: ``benchmarks/results`` only for
a complete report of the 10 headline seeds at the default budget, ``--output_dir`` otherwise) and the weights and
``runs.jsonl`` (one line per finished (seed, arm) run) to ``--output_dir``. ``--workers 2`` (default) runs the
warm-ups, then the (seed, arm) runs, in two single-threaded processes.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gigpo_trl.trainer as trainer_module  # noqa: E402
from gigpo_trl import GiGPOConfig, GiGPOTrainer  # noqa: E402
from gigpo_trl.envs.corridor import INSTRUCTION as CORRIDOR_INSTRUCTION  # noqa: E402
from gigpo_trl.envs.corridor import DEAD_ENDS, MOVES, OPPOSITE, PASSAGES, CorridorEnv, reset_clock  # noqa: E402
from gigpo_trl.envs.frozenlake import ACTION_NAMES, FrozenLakeEnv  # noqa: E402
from gigpo_trl.envs.frozenlake import INSTRUCTION as FROZENLAKE_INSTRUCTION  # noqa: E402
from gigpo_trl.models import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from gigpo_trl.prompts import build_messages  # noqa: E402
from results_io import provenance  # noqa: E402

# The arms: GiGPOConfig fields that differ between them (everything else is shared).
ARMS = {
    "GiGPO": {"step_advantage_weight": 1.0},
    "GRPO": {"step_advantage_weight": 0.0},
    "HGPO": {"step_advantage_weight": 1.0, "step_grouping": "hierarchical", "hierarchy_depth": 2},
    # the recipe's ALFWorld run script: gamma 0.10 (its WebShop script: 0.20), distance form off
    "GraphGPO": {"step_advantage_weight": 1.0, "step_return": "graph", "gamma": 0.1, "graph_normalize_distance": False},
}


def arm_available(arm: str) -> bool:
    """Whether this checkout's GiGPOConfig has the fields of ``arm`` (HGPO: issue 15, GraphGPO: issue 32)."""
    return set(ARMS[arm]) <= {f.name for f in dataclasses.fields(GiGPOConfig)}


def default_arms() -> list[str]:
    """GiGPO, GRPO, HGPO and GraphGPO (the authors' recipes), those whose fields this checkout's config has."""
    return [arm for arm in ARMS if arm_available(arm)]


# Fixed before the headline run; never used for a design run (the budget's design run uses DESIGN_SEEDS, the
# warm-up was checked on 1, 2 and 100-103).
HEADLINE_SEEDS = [200, 201, 202, 203, 204, 205, 206, 207, 208, 209]
DESIGN_SEEDS = [100, 101, 102, 103, 104]

# The map (issue 35; pre-registered in benchmarks/README.md, "The map" section, before any of its runs): fresh seeds,
# never used before (not 0-11, 100-104, 200-209, 300-304, 500-509), the map's design seeds apart from them.
MAP_SEEDS = [600, 601, 602, 603, 604, 605, 606, 607]
MAP_DESIGN_SEEDS = [700, 701, 702, 703, 704]
MAP_EVAL_TASKS = 128
# One cell of the map per condition: the corridor settings and config fields that differ from the headline
# testbed's (TESTBEDS["corridor"]); ``iterations`` None = not yet set by the condition's design run (the budget
# rule in benchmarks/README.md), so the condition refuses to run without an explicit --iterations.
# ``axis``/``label``: where the cell sits in the map's figure. ``arms``: GraphGPO matches states exactly (its graph's
# nodes), so it has no similarity-anchor cell.
CONDITIONS = {
    "h6": dict(axis="horizon", label="6 rooms", length=6, max_turns=15, walk_turns=18, iterations=10),
    "h12": dict(axis="horizon", label="12 rooms", length=12, max_turns=30, walk_turns=36, iterations=10),
    "h24": dict(axis="horizon", label="24 rooms", length=24, max_turns=60, walk_turns=72, iterations=10),
    "clock": dict(axis="anchors", label="nuisance,\nexact", nuisance="clock", iterations=10),
    "clock_sim": dict(axis="anchors", label="nuisance,\nsimilarity 0.9", nuisance="clock",
                      anchor_similarity_threshold=0.9, iterations=10,
                      arms=("GiGPO", "GRPO", "HGPO")),
    "clock_hook": dict(axis="anchors", label="nuisance,\nanchor_state()", nuisance="clock",
                       anchor_drops_nuisance=True, iterations=10),
    "trap": dict(axis="failure", label="trap door", trap_door=True, iterations=20),
}
# Cells that the figure's axes share: h12 is also "exact anchors" and "diffuse failure".
MAP_AXES = {"horizon": ["h6", "h12", "h24"], "anchors": ["h12", "clock", "clock_sim", "clock_hook"],
            "failure": ["h12", "trap"]}
MAP_AXIS_LABELS = {("anchors", "h12"): "exact\n(no nuisance)", ("failure", "h12"): "diffuse\n(dead ends)"}


# Two-sided 95% t quantiles t_{0.975, df} (scipy may be missing); df > 30 uses the normal quantile.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042}


def t_interval(values) -> tuple[float, float, float]:
    """(mean, lo, hi): the 95% t interval of the mean of ``values`` (nan bounds for fewer than 2 values)."""
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if x.size < 2:
        return m, float("nan"), float("nan")
    df = x.size - 1
    t = T975.get(df) or (T975[max(k for k in T975 if k <= df)] if df <= 30 else 1.960)
    half = t * float(x.std(ddof=1)) / np.sqrt(x.size)
    return m, m - half, m + half


# ---------------------------------------------------------------------------------------------- testbeds
TAGS = ["<think>", "</think>", "<action>", "</action>"]
THINK = "go"


def completion_text(move: str, think: bool = True) -> str:
    return f"<think>{THINK}</think><action>{move}</action>" if think else f"<action>{move}</action>"


class CompactCorridor(CorridorEnv):
    """CorridorEnv with a compact prompt (~50 instead of ~150 tokens of fixed text): only ``system_prompt`` /
    ``prompt_template`` differ; observations, dynamics, rewards and anchors are the env's."""

    system_prompt = "Rooms in a row; one door leads on. Answer <think>go</think><action>MOVE</action>."
    prompt_template = "{history}Now: {observation}"
    action_words = MOVES


class DoorCorridor(CompactCorridor):
    """CompactCorridor whose actions name the door to walk through by its kind (``arch``, ``stairs``, ``closet``,
    ``niche``: the words the observation uses) instead of its direction, and ``back`` for the way out of a dead
    end. Each action is translated to the env's own move, so observations, dynamics, rewards and anchors are
    ``CorridorEnv``'s; a door that is not in the room (or any other text) is an invalid action. Why: a 100k-
    parameter policy learns "prefer these door words" from reward within this CPU budget, but did not learn
    "read which side the good door is on" (design runs in benchmarks/README.md); the credit-assignment problem,
    12+ door choices per episode and one reward at the end, is the same."""

    system_prompt = "Rooms in a row; one door leads on. Answer <think>go</think><action>DOOR</action>."
    action_words = PASSAGES + DEAD_ENDS + ("back",)

    def _door_moves(self) -> dict:
        if not self.rooms or self.done:
            return {}
        room = self.rooms[self.room]
        if self.in_dead_end:
            return {"back": OPPOSITE[room.dead_end]}
        doors = {room.passage: room.passage_kind, room.dead_end: room.dead_end_kind}
        return {doors[m]: m for m in MOVES if m in doors}  # in the observation's order, never passage-first

    def step(self, action: str):
        move = self._door_moves().get(str(action).strip().lower())
        return super().step(move if move is not None else self.invalid_action)

    def legal_moves(self) -> list[str]:
        """The doors of the current state (both of a room; ``back`` in a dead end); nothing about which leads on."""
        return list(self._door_moves()) or list(self.action_words)

    def expert_action(self) -> str:
        move = super().expert_action()
        return next((door for door, m in self._door_moves().items() if m == move), "back")

    def _info(self, **extra):
        return super()._info(**extra) | {"admissible_actions": self.legal_moves()}


# The former testbed (now the smoke option): FrozenLake 4x4 with a compact prompt plus a local-view line.
CELL_NAMES = {"S": "ice", "F": "ice", "H": "hole", "G": "goal"}


class LocalViewFrozenLake(FrozenLakeEnv):
    """FrozenLakeEnv with a compact prompt whose observation adds one line naming what each move leads to
    (``up edge, down ice, left edge, right hole``); ``anchor_state`` returns the env's own grid text, so maps,
    dynamics, rewards and anchor groups are FrozenLakeEnv's."""

    system_prompt = "FrozenLake. P is you, O a hole, G the goal. Answer <think>go</think><action>MOVE</action>."
    prompt_template = "{history}Map:\n{observation}\nMove up, down, left or right."
    action_words = ACTION_NAMES

    def render(self) -> str:
        grid = super().render()
        if not self.grid:
            return grid
        parts = []
        for move in ACTION_NAMES:
            nxt = self._moved(self.pos, move)
            parts.append(f"{move} {'edge' if nxt == self.pos else CELL_NAMES[self.grid[nxt[0]][nxt[1]]]}")
        return grid + "\n" + ", ".join(parts)

    def anchor_state(self, observation):
        return "\n".join(str(observation).split("\n")[: self.size])

    def legal_moves(self) -> list[str]:
        """Moves that neither bump into the edge nor step into a hole (the rules, not the way to the goal)."""
        moves = []
        for move in ACTION_NAMES:
            r, c = self._moved(self.pos, move)
            if (r, c) != self.pos and self.grid[r][c] != "H":
                moves.append(move)
        return moves or list(ACTION_NAMES)


# Settings per testbed; any --flag given on the command line overrides them.
TESTBEDS = {
    "corridor": dict(
        # iterations from the design run on DESIGN_SEEDS (GRPO's 5-iteration running mean of training success
        # reached 0.5 at iterations 9, 7, 6, 6 on seeds 100-103: the first multiple of 10 is 10; benchmarks/README)
        env="corridor", length=12, directions=2, max_turns=30, walk_turns=36, history_length=2, iterations=10,
        eval_every=2, eval_every_early=2, groups=4, num_generations=8, spg=4, lr=2.5e-5, gamma=0.95, train_tasks=256, eval_tasks=64,
        warmup_steps=400, warmup_max_steps=6000, seeds=HEADLINE_SEEDS, think=True, actions="doors",
        max_completion_length=10,
        advantage_mode="mean_std_norm",
    ),
    "frozenlake4": dict(
        env="frozenlake", map_size=4, p=0.8, max_turns=10, walk_turns=10, history_length=0, iterations=100,
        eval_every=25, eval_every_early=25, groups=8, num_generations=8, spg=4, lr=3e-4, gamma=0.95, train_tasks=64,
        eval_tasks=100,
        warmup_steps=1000, warmup_max_steps=3000, seeds=[0, 1, 2], think=True, max_completion_length=10,
        advantage_mode="mean_norm",
    ),
}


def env_factory_for(a):
    if a.env == "corridor":
        cls = DoorCorridor if a.actions == "doors" else CompactCorridor
        return functools.partial(cls, length=a.length, max_turns=a.max_turns, directions=a.directions,
                                 nuisance=a.nuisance or None, anchor_drops_nuisance=bool(a.anchor_drops_nuisance),
                                 trap_door=bool(a.trap_door))
    return functools.partial(LocalViewFrozenLake, size=a.map_size, p=a.p, max_turns=a.max_turns)


def instruction_for(a) -> str:
    return CORRIDOR_INSTRUCTION if a.env == "corridor" else FROZENLAKE_INSTRUCTION


# ---------------------------------------------------------------------------------------------- prompts
def random_prompt_messages(env, rng: random.Random, task_ids, history_length: int, walk_turns: int,
                           instruction: str, max_turns: int):
    """Messages of a prompt the collector could build: a state reached by a walk of uniformly random *legal*
    moves (random length < ``walk_turns``) on a training task, with the walk's last <= ``history_length``
    (observation, move) pairs. Returns (messages, the env in the prompt's state)."""
    env.reset(task=rng.choice(task_ids), seed=0)
    env.max_turns = 10**9  # the scratch walk is not cut by the turn limit
    history = []
    obs = env.render()
    for _ in range(rng.randrange(walk_turns)):
        move = rng.choice(env.legal_moves())
        before = copy.copy(env)
        new_obs, _, done, _ = env.step(move)
        if done:  # keep the state the prompt shows (the goal ends the walk)
            env = before
            break
        history.append((obs, move))
        obs = new_obs
    turn = min(len(history), max_turns - 1)
    window = history[len(history) - min(history_length, len(history)):] if history_length else []
    return build_messages(env, instruction, obs, window, turn, max_turns, env.legal_moves()), env


def make_tokenizer(a, env_factory, vocab_size: int):
    """Compact byte-level BPE trained on rendered prompts and completions, plus the four format tags as single
    tokens (so a completion is ~7 tokens)."""
    rng = random.Random(1234)
    env = env_factory()
    chat = build_tiny_tokenizer(["x"], vocab_size=300)  # only for its chat template
    texts = []
    for _ in range(300):
        msgs, _ = random_prompt_messages(env, rng, range(0, 10_000), a.history_length, a.walk_turns,
                                         instruction_for(a), a.max_turns)
        texts.append(chat.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
    words = list(env.action_words)
    texts += [completion_text(m, a.think) + "<|im_end|>" for m in words] * 50
    tok = build_tiny_tokenizer(texts, vocab_size=vocab_size)
    tok.add_tokens(TAGS + (words if a.env == "corridor" else []))  # each action word one token
    return tok


def _ids(encoded):
    return encoded["input_ids"] if hasattr(encoded, "keys") else encoded


# ---------------------------------------------------------------------------------------------- warm-up
class WarmupFailed(RuntimeError):
    """A seed's warm-up did not reach the legal-move rate or the door balance within its step cap."""


def warmup_batch(tok, a, env, rng, train_tasks):
    """One batch of the warm-up: ``a.warmup_batch`` random-walk states, each ONCE PER LEGAL MOVE (so a room with
    two doors gives two sequences, same prompt, one per door). Cross-entropy over the batch then targets the uniform
    distribution over the state's legal moves exactly, not a random draw of it: no door word is favoured by chance
    draws (the old one-target-per-state recipe left a passage preference of 0.40-0.63 across seeds).
    Returns (input_ids, attention_mask, labels), left-padded as in generation."""
    eos, pad_id = tok.eos_token_id, tok.pad_token_id
    seqs, labels = [], []
    for _ in range(a.warmup_batch):
        msgs, state = random_prompt_messages(env, rng, train_tasks, a.history_length, a.walk_turns,
                                             instruction_for(a), a.max_turns)
        p = list(_ids(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)))
        for move in state.legal_moves():
            c = tok.encode(completion_text(move, a.think), add_special_tokens=False)
            seqs.append(p + c + [eos])
            labels.append([-100] * len(p) + c + [eos])
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, lb) in enumerate(zip(seqs, labels)):
        ids[i, width - len(s):] = torch.tensor(s)
        lab[i, width - len(s):] = torch.tensor(lb)
        att[i, width - len(s):] = 1
    return ids, att, lab


def door_balanced(check, a) -> bool:
    """Whether the sampled passage preference is within ``0.5 +- a.warmup_balance_tol`` (None: no two-door state
    was sampled legally, which counts as not balanced)."""
    pref = check["leads_on_among_two_legal"]
    return pref is not None and abs(pref - 0.5) <= a.warmup_balance_tol + 1e-12  # 0.55 - 0.5 > 0.05 in floats


def legal_move_warmup(model, tok, a, env_factory, train_tasks, seed):
    """Supervised legal-move warm-up of one seed's policy (the rules, not the way). Cross-entropy on completion
    tokens against the uniform distribution over the state's legal moves (``warmup_batch``).

    Phase 1 (rules): at least ``warmup_steps`` steps at ``warmup_lr``; then, every 100 steps, a sampled check on
    256 fresh prompts, until ``legal >= warmup_legal``; an attempt that has not got there after
    ``warmup_restart_steps`` steps restarts from a fresh init (init seed ``seed + 10000 * restart``; 0 = never). Phase 2 (balance): ``warmup_balance_steps`` more steps with
    the learning rate decaying linearly to 0 (a constant rate leaves whatever word preference the last batches
    pushed), then the final sampled check on ``warmup_check`` prompts; if it is not both legal (>= ``warmup_legal``)
    and balanced (passage chosen in ``0.5 +- warmup_balance_tol`` of the legal two-door samples), phase 2 runs
    again. Every step counts against ``warmup_max_steps``.

    Returns a dict: loss (last step), steps, rules_steps (end of phase 1), balance_rounds, restarts, init_seed (of
    the weights returned), seconds, cpu_seconds, and the final
    check's valid_format / legal / leads_on_among_two_legal / n_two_door. Raises ``WarmupFailed`` naming the seed
    when the cap is reached first (``a.warmup_fail_soft``: return instead, with ``failed`` set, for ``--quick``)."""
    t0, c0 = time.perf_counter(), time.process_time()
    rng = random.Random(seed)
    env = env_factory()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.warmup_lr, weight_decay=0.0)
    loss_val, step, rules_steps, rounds, check = float("nan"), 0, None, 0, None

    def train_step(lr):
        nonlocal loss_val, step
        for g in opt.param_groups:
            g["lr"] = lr
        ids, att, lab = warmup_batch(tok, a, env, rng, train_tasks)
        out = model(input_ids=ids, attention_mask=att, labels=lab)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_val, step = out.loss.item(), step + 1

    def sampled_check(n, check_seed):
        model.eval()
        c = check_warmup(model, tok, a, env_factory, train_tasks, n=n, seed=check_seed)
        model.train()
        return c

    failure, restarts, init_seed, attempt_start = None, 0, seed, 0
    while rules_steps is None:  # phase 1
        if step >= a.warmup_max_steps:
            failure = (f"legal moves {check['legal'] if check else float('nan'):.3f} < {a.warmup_legal} after "
                       f"{restarts} restart(s)")
            break
        if a.warmup_restart_steps and step - attempt_start >= a.warmup_restart_steps:
            # A seed whose init has not picked the rules up by now rarely does soon (the old seed 1: 61 % legal
            # after 1,500 steps); start again from a fresh init derived from the seed (deterministic).
            restarts += 1
            init_seed = seed + 10_000 * restarts
            fresh = build_tiny_model(tok, hidden_size=a.hidden, num_layers=a.layers, seed=init_seed)
            model.load_state_dict(fresh.state_dict())
            opt = torch.optim.AdamW(model.parameters(), lr=a.warmup_lr, weight_decay=0.0)
            attempt_start = step
            print(f"  seed {seed} warm-up: no legal play after {a.warmup_restart_steps} steps (legal "
                  f"{check['legal'] if check else float('nan'):.3f}); restart {restarts} from init seed {init_seed}",
                  flush=True)
        train_step(a.warmup_lr)
        if step - attempt_start >= a.warmup_steps and step % 100 == 0:
            check = sampled_check(256, seed + 1000 + step)
            if step % 500 == 0 or check["legal"] >= a.warmup_legal:
                print(f"  seed {seed} warm-up step {step}: legal {check['legal']:.3f} "
                      f"({time.perf_counter() - t0:.0f}s)", flush=True)
            if check["legal"] >= a.warmup_legal:
                rules_steps = step
    while failure is None:  # phase 2, repeated until legal and balanced
        if step + a.warmup_balance_steps > a.warmup_max_steps:
            failure = (f"after {rounds} balance round(s): legal {check['legal']:.3f}, passage preference "
                       f"{check['leads_on_among_two_legal']} (need >= {a.warmup_legal} and 0.5 +- "
                       f"{a.warmup_balance_tol})")
            break
        rounds += 1
        for i in range(a.warmup_balance_steps):
            train_step(a.warmup_lr * (1 - i / a.warmup_balance_steps))
        check = sampled_check(a.warmup_check, seed + 5000 + rounds)
        print(f"  seed {seed} warm-up balance round {rounds} (step {step}): legal {check['legal']:.3f}, passage "
              f"preference {check['leads_on_among_two_legal']} ({time.perf_counter() - t0:.0f}s)", flush=True)
        if check["legal"] >= a.warmup_legal and door_balanced(check, a):
            break
    model.eval()
    stats = {"loss": loss_val, "steps": step, "rules_steps": rules_steps, "balance_rounds": rounds,
             "restarts": restarts, "init_seed": init_seed,
             "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0} | (check or {})
    if failure is not None:
        msg = f"seed {seed}: warm-up failed at the {a.warmup_max_steps}-step cap (--warmup_max_steps): {failure}"
        if not a.warmup_fail_soft:
            raise WarmupFailed(msg)
        print(f"WARNING {msg} (--quick: going on)", flush=True)
        stats["failed"] = msg
    return stats


def check_warmup(model, tok, a, env_factory, train_tasks, n=96, seed=0):
    """On sampled completions (T = 1, torch seeded with ``seed``) for ``n`` random-walk prompts: the fraction that
    parse as a move (valid_format), the fraction that are legal, and, over the legal samples in states with two
    legal moves (n_two_door of them), the fraction that pick the one leading on (leads_on_among_two_legal; corridor:
    the passage; 0.5 means the warm-up carried no information about it; None when no such sample)."""
    from gigpo_trl.parsing import parse_action

    rng = random.Random(seed + 99)
    torch.manual_seed(seed)
    env = env_factory()
    words = set(env.action_words)
    valid, legal, on = [], [], []
    for lo in range(0, n, 256):  # generate in chunks: bounded memory for the large final check
        prompts, states = [], []
        for _ in range(min(256, n - lo)):
            msgs, state = random_prompt_messages(env, rng, train_tasks, a.history_length, a.walk_turns,
                                                 instruction_for(a), a.max_turns)
            prompts.append(_ids(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)))
            states.append(copy.copy(state))  # the scratch env is reused by the next walk
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
        att = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            att[i, width - len(p):] = 1
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=12, do_sample=True, top_k=0,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        parsed = [parse_action(t, require_think=a.think)
                  for t in tok.batch_decode(out[:, width:], skip_special_tokens=True)]
        for p, s in zip(parsed, states):
            ok = p.valid and p.action in words
            lg = ok and p.action in s.legal_moves()
            valid.append(ok)
            legal.append(lg)
            if lg and len(s.legal_moves()) == 2:
                on.append(p.action == s.expert_action())
    return {"valid_format": float(np.mean(valid)), "legal": float(np.mean(legal)),
            "leads_on_among_two_legal": float(np.mean(on)) if on else None, "n_two_door": len(on)}


# ---------------------------------------------------------------------------------------------- RL
class AnchorRecorder:
    """Wraps the trainer module's ``compute_gigpo_advantages`` to keep, per training iteration, the size of the
    step group of every row (the histogram the trainer does not log). Benchmark-only instrumentation."""

    def __init__(self):
        self.mode = "train"
        self.iterations: list[np.ndarray] = []
        self.deepest: list[np.ndarray] = []  # HGPO: sizes of the deepest level's groups G_K
        self._orig = trainer_module.compute_gigpo_advantages

    def install(self):
        orig = self._orig

        def wrapped(*args, **kwargs):
            result = orig(*args, **kwargs)
            if self.mode == "train":
                self.iterations.append(np.asarray(result.anchor_group_sizes, dtype=np.int64).copy())
                levels = getattr(result, "level_group_sizes", None)
                if levels is not None and np.ndim(levels) == 2:
                    self.deepest.append(np.asarray(levels, dtype=np.int64)[:, -1].copy())
            return result

        trainer_module.compute_gigpo_advantages = wrapped  # the name trainer.py calls
        return self


RECORDER: AnchorRecorder | None = None


class BenchTrainer(GiGPOTrainer):
    """GiGPOTrainer that tells the recorder whether a rollout is for training or evaluation (the only override)."""

    def _generate_and_score_completions(self, inputs):
        if RECORDER is not None:
            RECORDER.mode = "train" if self.model.training else "eval"
        return super()._generate_and_score_completions(inputs)


SIZE_BINS = [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, None)]


def bin_label(lo, hi):
    return f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi is not None else f"{lo}+")


def row_size_hist(sizes: np.ndarray) -> dict:
    """Fraction of rows whose step group has a size in each of ``SIZE_BINS``."""
    if sizes.size == 0:
        return {}
    return {bin_label(lo, hi): float(((sizes >= lo) & ((sizes <= hi) if hi else True)).mean()) for lo, hi in SIZE_BINS}


def eval_schedule(iterations: int, every: int, every_early: int) -> list[int]:
    """Iterations after which the arms are evaluated on held-out tasks (iteration 0, before training, is always
    evaluated too): the last three ``every`` apart (the headline is their mean), before them every ``every_early``
    (the AUC's coarser early points). E.g. (60, 5, 10) -> [10, 20, 30, 40, 50, 55, 60]; (30, 5, 5) ->
    [5, 10, ..., 30]. Raises ValueError when the last three would not fit after iteration 0."""
    if min(every, every_early) < 1 or iterations < 3 * every:
        raise ValueError(f"eval schedule: need eval_every >= 1, eval_every_early >= 1 and iterations >= 3 * "
                         f"eval_every, got iterations={iterations}, eval_every={every}, eval_every_early={every_early}")
    late = [iterations - 2 * every, iterations - every, iterations]
    return [it for it in range(every_early, late[0], every_early)] + late


def auc(points) -> float:
    """Area under the held-out success curve (sampled), normalised by the iterations it spans: the trapezoid rule
    over the evaluation points (iteration, success), divided by last - first iteration, so in [0, 1] (the mean
    success over training; a flat curve at s gives s). ``points``: dicts with ``iteration`` and ``sampled``."""
    pts = sorted((p["iteration"], p["sampled"]) for p in points)
    x, y = np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts], dtype=float)
    if len(x) < 2 or x[-1] <= x[0]:
        raise ValueError(f"auc needs evaluation points at >= 2 distinct iterations, got {list(x)}")
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / (x[-1] - x[0]))


class PeriodicEval:
    """TrainerCallback: held-out evaluation at the iterations of ``eval_iterations`` (sampled at T = 1; greedy too at
    those in ``greedy_iterations``)."""

    def __init__(self, eval_iterations, greedy_iterations, spg, sampled_temperature):
        from transformers import TrainerCallback

        outer = self

        class _CB(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                it, rest = divmod(state.global_step, spg)
                if rest == 0 and it in outer.eval_iterations and outer.trainer is not None:
                    t0, c0 = time.perf_counter(), time.process_time()
                    outer.points.append(evaluate_both(outer.trainer, outer.sampled_temperature,
                                                      greedy=it in outer.greedy_iterations) | {"iteration": it})
                    outer.eval_seconds += time.perf_counter() - t0
                    outer.eval_cpu_seconds += time.process_time() - c0
                    p = outer.points[-1]
                    greedy = f"{p['greedy']:.2f}" if "greedy" in p else "-"
                    print(f"    {outer.label} it {it}: sampled {p['sampled']:.2f} greedy {greedy} "
                          f"({time.perf_counter() - outer.t_start:.0f}s)", flush=True)
                return control

        self.callback = _CB()
        self.sampled_temperature = sampled_temperature
        self.eval_iterations = set(eval_iterations)
        self.greedy_iterations = set(greedy_iterations)
        self.trainer = None
        self.points: list[dict] = []
        self.eval_seconds = 0.0
        self.eval_cpu_seconds = 0.0  # single-threaded process: ~ the wall time on an idle core
        self.label = ""
        self.t_start = time.perf_counter()


def evaluate_both(trainer, temperature: float, greedy: bool = True) -> dict:
    """Held-out success sampled at ``temperature`` and (``greedy``) greedily (eval_temperature = 0), on the same
    tasks; every task of a call runs in one batch (``per_device_eval_batch_size`` = eval tasks)."""
    saved = trainer.args.eval_temperature
    try:
        trainer.args.eval_temperature = temperature
        m = trainer.evaluate(metric_key_prefix="eval_sampled")
        sampled = {"sampled": m["eval_sampled_success_rate"], "sampled_length": m.get("eval_sampled_length_mean")}
        if not greedy:
            return sampled
        trainer.args.eval_temperature = 0.0
        m = trainer.evaluate()
        return sampled | {"greedy": m["eval_success_rate"], "greedy_length": m.get("eval_length_mean"),
                          "greedy_invalid": m.get("eval_invalid_action_rate")}
    finally:
        trainer.args.eval_temperature = saved


def make_config(a, out_dir: str, arm_fields: dict, seed: int) -> GiGPOConfig:
    """The run's shared settings; the arm's fields override them (GraphGPO: its own gamma)."""
    shared = dict(
        output_dir=out_dir, seed=seed, data_seed=seed,
        num_generations=a.num_generations, per_device_train_batch_size=a.groups * a.num_generations // a.spg,
        steps_per_generation=a.spg, max_steps=a.iterations * a.spg, max_turns=a.max_turns,
        history_length=a.history_length, learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, temperature=1.0, top_k=0, top_p=1.0,
        max_completion_length=a.max_completion_length, gamma=a.gamma, advantage_mode=a.advantage_mode,
        bf16=False, gradient_checkpointing=False, use_cpu=True, report_to="none", save_strategy="no",
        disable_tqdm=True, logging_steps=1, eval_max_tasks=a.eval_tasks, eval_temperature=0.0,
        per_device_eval_batch_size=a.eval_tasks, require_think=a.think,
    )
    if a.anchor_similarity_threshold is not None and arm_fields.get("step_return") != "graph":
        shared["anchor_similarity_threshold"] = a.anchor_similarity_threshold
    return GiGPOConfig(**{**shared, **arm_fields})


LOG_KEYS = ["episode/success_rate", "episode/length_mean", "episode/invalid_action_rate", "rollout/rows",
            "completions/mean_length", "anchor/singleton_fraction", "anchor/row_group_size_mean",
            "anchor/group_size_mean", "rollout/seconds", "graph/states_reaching_success", "graph/rows_reaching_success"]


def iteration_series(log_history) -> dict:
    """Per training iteration (one rollout), the logged metrics in ``LOG_KEYS``."""
    return {k: [float(e[k]) for e in log_history if k in e] for k in LOG_KEYS}


def iters_to(series, level=0.5, window=5):
    """First iteration (1-based) at which the ``window``-iteration running mean of ``series`` is >= ``level``.

    Only full windows count (the first candidate is iteration ``window``): a partial window at the start is one or
    two rollouts taken before the arms differ, e.g. a first rollout that succeeds half the time by chance."""
    x = np.asarray(series, dtype=float)
    for i in range(window - 1, len(x)):
        if x[i - window + 1: i + 1].mean() >= level:
            return i + 1
    return None


def run_arm(a, arm, seed, init_dir, tok, env_factory, train_ds, eval_ds):
    from transformers import AutoModelForCausalLM, PrinterCallback

    global RECORDER
    reset_clock()  # every (seed, arm) run sees the clock cells' clock lines from 1, whatever ran before it here
    RECORDER = AnchorRecorder().install()
    try:
        model = AutoModelForCausalLM.from_pretrained(init_dir)
        schedule = eval_schedule(a.iterations, a.eval_every, a.eval_every_early)
        cb = PeriodicEval(schedule, schedule[-3:], a.spg, a.sampled_eval_temperature)  # greedy: headline points
        args = make_config(a, str(Path(a.output_dir) / f"seed{seed}" / arm), ARMS[arm], seed)
        trainer = BenchTrainer(model, env=env_factory, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                               processing_class=tok, callbacks=[cb.callback])
        cb.trainer = trainer
        cb.label = f"seed {seed} {arm}"
        trainer.remove_callback(PrinterCallback)  # the per-step log dicts; everything is kept in log_history
        t0, c0 = time.perf_counter(), time.process_time()
        start = evaluate_both(trainer, a.sampled_eval_temperature) | {"iteration": 0}
        start_secs, start_cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.train()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        series = iteration_series(trainer.state.log_history)
        trainer.collector.close()
        sizes, deepest = RECORDER.iterations, RECORDER.deepest
    finally:
        trainer_module.compute_gigpo_advantages = RECORDER._orig
        RECORDER = None
    points = [start] + cb.points
    last3 = points[-3:]
    rows = np.asarray(series["rollout/rows"])
    tokens = rows * np.asarray(series["completions/mean_length"][: len(rows)])
    thirds = np.array_split(np.arange(len(sizes)), 3)
    anchor_phases = {}
    for name, idx in zip(("early", "middle", "late"), thirds):
        if len(idx):
            pooled = np.concatenate([sizes[i] for i in idx])
            sf = [series["anchor/singleton_fraction"][i] for i in idx if i < len(series["anchor/singleton_fraction"])]
            anchor_phases[name] = {"iterations": [int(idx[0]) + 1, int(idx[-1]) + 1],
                                   "singleton_group_fraction": float(np.mean(sf)) if sf else None,
                                   "rows_in_groups_ge2": float((pooled >= 2).mean()),
                                   "row_size_hist": row_size_hist(pooled),
                                   "row_group_size_mean": float(pooled.mean())}
            if len(deepest) == len(sizes):
                anchor_phases[name]["deepest_level_rows_in_groups_ge2"] = float(
                    (np.concatenate([deepest[i] for i in idx]) >= 2).mean())
    result = {
        "arm": arm, "fields": ARMS[arm], "seed": seed, "points": points,
        "run_settings": {k: getattr(a, k) for k in RUN_KEYS},
        "headline_sampled": float(np.mean([p["sampled"] for p in last3])),
        "headline_greedy": float(np.mean([p["greedy"] for p in last3])),
        "auc_sampled": auc(points),
        "iters_to_50pct_train": iters_to(series["episode/success_rate"]),
        "env_steps": int(rows.sum()), "generated_tokens": int(round(float(tokens.sum()))),
        "wall_seconds": wall + start_secs, "eval_seconds": cb.eval_seconds + start_secs,
        # CPU seconds of this single-threaded run: ~ its wall time on an idle core (for the budget arithmetic)
        "cpu_seconds": cpu + start_cpu, "eval_cpu_seconds": cb.eval_cpu_seconds + start_cpu,
        "train_cpu_seconds_per_iteration": (cpu - cb.eval_cpu_seconds) / a.iterations,
        "series": series, "anchor_phases": anchor_phases,
    }
    sampled = " ".join(f"{p['sampled']:.2f}" for p in points)
    greedy = " ".join(f"{p['greedy']:.2f}" if "greedy" in p else "-" for p in points)
    print(f"  seed {seed} {arm:5s}: sampled {sampled} | greedy {greedy} | last3 {result['headline_sampled']:.3f}/"
          f"{result['headline_greedy']:.3f} | AUC {result['auc_sampled']:.3f} | 50% at it {result['iters_to_50pct_train']} | "
          f"wall {result['wall_seconds']:.0f}s, CPU {result['cpu_seconds']:.0f}s (train "
          f"{result['train_cpu_seconds_per_iteration']:.2f}s/iteration, evaluations {result['eval_cpu_seconds']:.0f}s)",
          flush=True)
    return result


WARMUP_KEYS = ("testbed", "env", "length", "directions", "nuisance", "trap_door", "map_size", "p", "max_turns",
               "walk_turns", "history_length", "train_tasks", "think", "actions", "hidden", "layers", "vocab", "warmup_steps", "warmup_max_steps",
               "warmup_legal", "warmup_batch", "warmup_lr", "warmup_balance_steps", "warmup_balance_tol",
               "warmup_check", "warmup_restart_steps")


def warm_up_seed(seed, a, tok, env_factory, train_tasks, out):
    """Legal-move warm-up of one seed's policy; the weights are saved to ``out/seed{seed}/init`` for every arm.
    Returns the warm-up figures (``legal_move_warmup``, plus params and the settings that made them); a failed
    warm-up returns them with ``failed`` (the message naming the seed) and saves no weights."""
    torch.set_num_threads(1)
    init_dir = Path(a.warmup_dir or out) / f"seed{seed}" / "init"
    settings = {k: getattr(a, k) for k in WARMUP_KEYS}
    if a.reuse_warmup and (init_dir / "warmup_stats.json").exists():
        stats = json.loads((init_dir / "warmup_stats.json").read_text())
        from transformers import AutoTokenizer

        same_tok = AutoTokenizer.from_pretrained(init_dir).get_vocab() == tok.get_vocab()
        if stats.get("settings") == settings and same_tok:
            print(f"seed {seed}: warm-up weights reused from {init_dir}", flush=True)
            return stats | {"reused": True}
        print(f"seed {seed}: warm-up in {init_dir} was made with other settings or another tokenizer; warming up "
              "again", flush=True)
    model = build_tiny_model(tok, hidden_size=a.hidden, num_layers=a.layers, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    reset_clock()
    try:
        stats = legal_move_warmup(model, tok, a, env_factory, train_tasks, seed)
    except WarmupFailed as e:
        print(f"FAILED {e}", flush=True)
        return {"failed": str(e), "params": n_params, "settings": settings}
    stats |= {"params": n_params, "settings": settings}
    model.save_pretrained(init_dir)
    tok.save_pretrained(init_dir)
    if "failed" in stats:  # a soft failure (--quick) keeps its weights but no stats file, so it is never reused
        (init_dir / "warmup_stats.json").unlink(missing_ok=True)
    else:
        (init_dir / "warmup_stats.json").write_text(json.dumps(stats))
    print(f"seed {seed}: {n_params / 1e3:.0f}k params; " + warmup_line(stats), flush=True)
    return stats


def warmup_line(w: dict) -> str:
    """One line of a seed's warm-up figures."""
    if "legal" not in w:
        return f"warm-up FAILED: {w.get('failed')}"
    pref = w.get("leads_on_among_two_legal")
    return (f"warm-up {w['steps']} steps ({w.get('rules_steps')} to legal play, "
            + (f"{w['restarts']} restart(s), init seed {w.get('init_seed')}, " if w.get("restarts") else "")
            + f"{w.get('balance_rounds')} balance round(s)) in {w['seconds']:.0f}s (CPU "
            f"{w.get('cpu_seconds', float('nan')):.0f}s); final sampled check: legal {100 * w['legal']:.1f} %, passage "
            f"preference {'n/a' if pref is None else f'{pref:.3f}'} (n={w.get('n_two_door')}), loss {w['loss']:.3f}"
            + (" FAILED" if w.get("failed") else ""))


# The settings a (seed, arm) run's result depends on: runs merged by --report_only must agree on them.
RUN_KEYS = WARMUP_KEYS + ("iterations", "eval_every", "eval_every_early", "groups", "num_generations", "spg", "lr",
                          "gamma", "eval_tasks", "advantage_mode", "max_completion_length", "sampled_eval_temperature",
                          "condition", "anchor_drops_nuisance", "anchor_similarity_threshold")


def arm_job(job, a, tok, env_factory, train_ds, eval_ds, out):
    seed, arm = job
    torch.set_num_threads(1)
    return run_arm(a, arm, seed, str(Path(a.warmup_dir or out) / f"seed{seed}" / "init"), tok, env_factory, train_ds,
                   eval_ds)


# ---------------------------------------------------------------------------------------------- report
def gap_stats(results, seeds, a_arm, b_arm, key):
    gaps = [100 * (results[(s, a_arm)][key] - results[(s, b_arm)][key]) for s in seeds]
    m, lo, hi = t_interval(gaps)
    return {"per_seed_pp": dict(zip(map(str, seeds), gaps)), "gap_pp": m, "ci95_pp": [lo, hi]}


PRIMARY_METRIC = "headline_sampled"  # fixed before any headline run; named in learning.json
METRICS = {  # key in a run's result -> (label in the gap names, description)
    "headline_sampled": ("T=1", "held-out success, sampled at T=1, mean of the last 3 evaluations"),
    "headline_greedy": ("greedy", "held-out success, greedy, mean of the last 3 evaluations"),
    "auc_sampled": ("AUC T=1", "area under the held-out success curve (sampled at T=1; trapezoid over the "
                               "evaluation points from iteration 0, divided by the iterations)"),
}


def report(results, seeds, arms, a, warmups=None):
    """The text report and the paired gaps (``gap_stats`` per arm pair and metric of ``METRICS``, keyed
    ``"{x}-{y}/{label}"``) of the runs ``results[(seed, arm)]`` over ``seeds``."""
    lines = []
    head = f"{'seed':>4} " + " ".join(f"{arm + ' T=1':>11} {arm + ' greedy':>12} {arm + ' AUC':>10}" for arm in arms)
    lines += ["held-out success, mean of the last 3 evaluations (iterations "
              f"{', '.join(str(p['iteration']) for p in results[(seeds[0], arms[0])]['points'][-3:])}), and the "
              f"area under the sampled held-out success curve (AUC; evaluations at iterations "
              f"{', '.join(str(p['iteration']) for p in results[(seeds[0], arms[0])]['points'])}):", head,
              "-" * len(head)]
    for s in seeds:
        lines.append(f"{s:>4} " + " ".join(f"{results[(s, arm)]['headline_sampled']:11.3f} "
                                           f"{results[(s, arm)]['headline_greedy']:12.3f} "
                                           f"{results[(s, arm)]['auc_sampled']:10.3f}" for arm in arms))
    lines.append("-" * len(head))
    lines.append(f"{'mean':>4} " + " ".join(
        f"{np.mean([results[(s, arm)]['headline_sampled'] for s in seeds]):11.3f} "
        f"{np.mean([results[(s, arm)]['headline_greedy'] for s in seeds]):12.3f} "
        f"{np.mean([results[(s, arm)]['auc_sampled'] for s in seeds]):10.3f}" for arm in arms))
    pairs = [(x, y) for x, y in (("GiGPO", "GRPO"), ("HGPO", "GiGPO"), ("HGPO", "GRPO"), ("GraphGPO", "GiGPO"),
                                 ("GraphGPO", "GRPO")) if x in arms and y in arms]
    gaps = {}
    lines.append("")
    lines.append(f"paired gaps over seeds (percentage points; 95% t interval, df = seeds - 1); primary metric: "
                 f"{METRICS[PRIMARY_METRIC][0]} ({METRICS[PRIMARY_METRIC][1]}):")
    for x, y in pairs:
        for key, (label, _) in METRICS.items():
            g = gap_stats(results, seeds, x, y, key)
            gaps[f"{x}-{y}/{label}"] = g
            lines.append(f"  {x} - {y} ({label:7s}): {g['gap_pp']:+6.1f} pp  [{g['ci95_pp'][0]:+6.1f}, "
                         f"{g['ci95_pp'][1]:+6.1f}]   per seed: "
                         + ", ".join(f"{v:+.1f}" for v in g["per_seed_pp"].values()))
    if warmups:
        lines.append("")
        lines.append("warm-ups (final sampled check; the same recipe for every seed):")
        for s in seeds:
            w = warmups.get(str(s)) or warmups.get(s)
            lines.append(f"  seed {s:>4}: " + (warmup_line(w) if w else "no warm-up figures"))
    lines.append("")
    lines.append("iterations until the 5-iteration running mean of training success >= 0.5 (- = never), "
                 "env steps and generated tokens per run (training rollouts):")
    for arm in arms:
        its = [results[(s, arm)]["iters_to_50pct_train"] for s in seeds]
        steps = [results[(s, arm)]["env_steps"] for s in seeds]
        toks = [results[(s, arm)]["generated_tokens"] for s in seeds]
        reached = [i for i in its if i is not None]
        lines.append(f"  {arm:5s}: per seed {' '.join(str(i) if i else '-' for i in its)}; mean over seeds that "
                     f"reached it {np.mean(reached) if reached else float('nan'):.1f} ({len(reached)}/{len(seeds)})"
                     f"; env steps {np.mean(steps):,.0f}; tokens {np.mean(toks):,.0f}")
    lines.append("")
    lines.append("anchor (step-group) statistics of the training rollouts, mean over seeds: fraction of step groups "
                 "that are singletons; fraction of rows by the size of their step group")
    lines.append(f"  {'arm':5s} {'phase':6s} {'iters':>7} {'singl.':>6} {'rows>=2':>7} "
                 + " ".join(f"{bin_label(lo, hi):>5}" for lo, hi in SIZE_BINS))
    for arm in arms:
        for phase in ("early", "middle", "late"):
            ps = [results[(s, arm)]["anchor_phases"].get(phase) for s in seeds]
            ps = [p for p in ps if p]
            if not ps:
                continue
            hist = {k: np.mean([p["row_size_hist"].get(k, 0.0) for p in ps]) for k in ps[0]["row_size_hist"]}
            sg = [p["singleton_group_fraction"] for p in ps if p["singleton_group_fraction"] is not None]
            deep = [p["deepest_level_rows_in_groups_ge2"] for p in ps
                    if "deepest_level_rows_in_groups_ge2" in p and ARMS[arm].get("step_grouping") == "hierarchical"]
            lines.append(f"  {arm:5s} {phase:6s} {ps[0]['iterations'][0]:>3}-{ps[0]['iterations'][1]:<3} "
                         f"{np.mean(sg) if sg else float('nan'):6.3f} {np.mean([p['rows_in_groups_ge2'] for p in ps]):7.3f} "
                         + " ".join(f"{v:5.3f}" for v in hist.values())
                         + (f"   deepest HGPO level: rows>=2 {np.mean(deep):.3f}" if deep else ""))
    return "\n".join(lines), gaps


def plot(results, seeds, arms, a, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install matplotlib): no plot")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = {"GiGPO": "tab:blue", "GRPO": "tab:orange", "HGPO": "tab:green", "GraphGPO": "tab:red"}

    def band(ax, xs, ys, color, label):
        ys = np.asarray(ys, dtype=float)
        m = ys.mean(0)
        if len(ys) > 1:
            df = len(ys) - 1
            q = T975.get(df, 1.96 if df > 30 else T975[max(k for k in T975 if k <= df)])
            half = q * ys.std(0, ddof=1) / np.sqrt(len(ys))
            ax.fill_between(xs, m - half, m + half, color=color, alpha=0.18)
        ax.plot(xs, m, color=color, lw=2, label=label)

    for arm in arms:
        pts = [results[(s, arm)]["points"] for s in seeds]
        xs = [p["iteration"] for p in pts[0]]
        band(axes[0], xs, [[p["sampled"] for p in ps] for ps in pts], colors[arm], arm)
        gx = [p["iteration"] for p in pts[0] if "greedy" in p]
        band(axes[1], gx, [[p["greedy"] for p in ps if "greedy" in p] for ps in pts], colors[arm], arm)
        tr = [np.asarray(results[(s, arm)]["series"]["episode/success_rate"]) for s in seeds]
        n = min(map(len, tr))
        if n:
            k = min(5, n)
            sm = [np.convolve(t[:n], np.ones(k) / k, mode="valid") for t in tr]
            band(axes[2], np.arange(k, n + 1), sm, colors[arm], arm)
    name = f"corridor, {a.length} rooms" if a.env == "corridor" else f"FrozenLake {a.map_size}x{a.map_size}"
    if getattr(a, "condition", None):
        name += f", condition {a.condition}"
    axes[0].set(title=f"held-out success, sampled T=1 ({name})", ylabel="success")
    axes[1].set(title="held-out success, greedy (start and the last 3 evaluations)")
    axes[2].set(title="training success (5-iteration running mean)")
    for ax in axes:
        ax.set(xlabel="training iteration", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(f"{len(seeds)} seeds: mean and 95% t band over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--testbed", default="corridor", choices=sorted(TESTBEDS))
    p.add_argument("--condition", choices=list(CONDITIONS), default=None,
                   help="one cell of the map (CONDITIONS; corridor): its settings, MAP_SEEDS, MAP_EVAL_TASKS eval "
                        "tasks; results to benchmarks/results/map/CONDITION/ for a complete cell")
    p.add_argument("--map_report", action="store_true",
                   help="no training: the map's table and figure from every --map_dir/*/learning.json")
    p.add_argument("--map_dir", default=None, help="--map_report: folder of the cells (default benchmarks/results/map)")
    p.add_argument("--nuisance", choices=["turn", "clock"], default=None,
                   help="corridor: a second observation line that never helps (CorridorEnv's nuisance)")
    p.add_argument("--anchor_drops_nuisance", action="store_true", default=None,
                   help="corridor: anchor_state() drops the nuisance line")
    p.add_argument("--trap_door", action="store_true", default=None,
                   help="corridor: one dead end per task is a trap door that ends the episode with reward 0")
    p.add_argument("--anchor_similarity_threshold", type=float, default=None,
                   help="GiGPOConfig.anchor_similarity_threshold for every arm but GraphGPO (exact states only)")
    p.add_argument("--warmup_dir", default=None,
                   help="where the warm-up weights are saved and (--reuse_warmup) found (default --output_dir), so "
                        "cells with the same warm-up settings share them")
    p.add_argument("--quick", action="store_true", help="<= 3-minute smoke version (seed 0 unless --seeds, 3 "
                   "iterations, 16 eval tasks, a short warm-up that may miss its targets)")
    p.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=None,
                   help="arms to run (default: all four, GiGPO GRPO HGPO GraphGPO); a split run can also add an arm later, merged with "
                        "--report_only")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="default: the 10 HEADLINE_SEEDS (corridor), fixed before the headline run")
    p.add_argument("--output_dir", default="outputs/bench/learning", help="weights and trainer outputs")
    p.add_argument("--results_dir", default=None, help="learning.json / learning_curve.png (default "
                   "benchmarks/results for a full run, output_dir otherwise)")
    p.add_argument("--iterations", type=int, help="rollout/update iterations per arm")
    p.add_argument("--eval_every", type=int, help="held-out evaluation: the last 3 this many iterations apart")
    p.add_argument("--eval_every_early", type=int, help="held-out evaluation before the last 3: every this many "
                   "iterations (see eval_schedule)")
    p.add_argument("--groups", type=int, help="task groups per iteration")
    p.add_argument("--num_generations", type=int, help="rollouts per group (N)")
    p.add_argument("--spg", type=int, help="steps_per_generation (optimizer steps per iteration)")
    p.add_argument("--length", type=int, help="corridor: number of rooms")
    p.add_argument("--directions", type=int, choices=[2, 4], help="corridor: doors left/right (2) or anywhere (4)")
    p.add_argument("--map_size", type=int, help="frozenlake: side of the map")
    p.add_argument("--p", type=float, help="frozenlake: probability that a cell is frozen")
    p.add_argument("--max_turns", type=int)
    p.add_argument("--walk_turns", type=int, help="warm-up prompts: random-walk length bound")
    p.add_argument("--history_length", type=int)
    p.add_argument("--train_tasks", type=int, help="size of the training task set")
    p.add_argument("--eval_tasks", type=int, help="held-out eval tasks")
    p.add_argument("--lr", type=float)
    p.add_argument("--gamma", type=float)
    p.add_argument("--advantage_mode", choices=["mean_norm", "mean_std_norm"])
    p.add_argument("--max_completion_length", type=int)
    p.add_argument("--actions", choices=["doors", "moves"],
                   help="corridor: name the door (DoorCorridor, default) or the direction (CompactCorridor)")
    p.add_argument("--sampled_eval_temperature", type=float, default=1.0)
    p.add_argument("--workers", type=int, default=2,
                   help="runs in parallel processes (each single-threaded); 1 = one after another")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=600)
    p.add_argument("--report_only", action="store_true",
                   help="no training: report the runs already in --runs (default OUTPUT_DIR/runs.jsonl), e.g. of a cut "
                        "run or of a run split across invocations")
    p.add_argument("--runs", nargs="+", default=None, metavar="RUNS_JSONL",
                   help="--report_only: runs.jsonl files to merge (each one's warmups.json is read from its folder)")
    p.add_argument("--warmup_only", action="store_true",
                   help="warm up the seeds (OUTPUT_DIR/seedS/init, warmups.json), print their figures and stop")
    p.add_argument("--reuse_warmup", action="store_true",
                   help="load a seed's warm-up weights from OUTPUT_DIR/seedS/init when a run with the same "
                        "settings left them there")
    p.add_argument("--warmup_steps", type=int, help="warm-up steps at least")
    p.add_argument("--warmup_max_steps", type=int,
                   help="warm-up steps at most, both phases; a seed that needs more fails the run, naming the seed")
    p.add_argument("--warmup_balance_steps", type=int, default=200,
                   help="warm-up phase 2: steps per balance round (learning rate decaying to 0)")
    p.add_argument("--warmup_balance_tol", type=float, default=0.05,
                   help="passage preference must end within 0.5 +- this on the final sampled check")
    p.add_argument("--warmup_check", type=int, default=1024, help="prompts in the warm-up's final sampled check")
    p.add_argument("--warmup_restart_steps", type=int, default=1500,
                   help="warm-up phase 1: restart from a fresh init (derived from the seed) when legal play is not "
                        "reached within this many steps of an attempt (0: never)")
    p.add_argument("--warmup_legal", type=float, default=0.95,
                   help="stop the warm-up once this fraction of sampled moves is legal")
    p.add_argument("--warmup_batch", type=int, default=32)
    p.add_argument("--warmup_lr", type=float, default=3e-3)
    a = p.parse_args(argv)
    a.seeds_given = a.seeds is not None
    if a.condition is not None:
        if a.testbed != "corridor":
            p.error(f"--condition {a.condition} is a corridor cell, not one of --testbed {a.testbed}")
        cell = {k: v for k, v in CONDITIONS[a.condition].items() if k not in ("axis", "label")}
        cell |= {"seeds": MAP_SEEDS, "eval_tasks": MAP_EVAL_TASKS}
        if "arms" in cell:
            cell["arms"] = list(cell["arms"])
        for key, value in cell.items():
            if getattr(a, key, None) is None:
                setattr(a, key, value)
        if a.arms and "arms" in CONDITIONS[a.condition]:
            left_out = [arm for arm in a.arms if arm not in CONDITIONS[a.condition]["arms"]]
            if left_out:
                p.error(f"--arms {' '.join(left_out)}: not an arm of condition {a.condition} "
                        f"({', '.join(CONDITIONS[a.condition]['arms'])})")
        if a.iterations is None and not (a.report_only or a.warmup_only or a.map_report or a.quick):
            p.error(f"condition {a.condition}: its iterations are not set yet (the budget rule's design run on "
                    f"MAP_DESIGN_SEEDS sets CONDITIONS['{a.condition}']['iterations']); give --iterations")
        if a.iterations is None:
            a.iterations = 3 if a.quick else TESTBEDS["corridor"]["iterations"]
        # evaluations every I // 5 iterations (at least 2): the headline's 0, 2, ..., 10 at I = 10, six points
        # however long the cell's budget
        for key in ("eval_every", "eval_every_early"):
            if getattr(a, key) is None:
                setattr(a, key, max(2, a.iterations // 5))
    for key, value in TESTBEDS[a.testbed].items():
        if getattr(a, key, None) is None:
            setattr(a, key, value)
    for key in ("length", "directions", "map_size", "p", "actions"):
        if getattr(a, key) is None:
            setattr(a, key, 0)
    a.anchor_drops_nuisance = bool(a.anchor_drops_nuisance)
    a.trap_door = bool(a.trap_door)
    if a.anchor_similarity_threshold is not None and not 0.0 < a.anchor_similarity_threshold < 1.0:
        p.error(f"--anchor_similarity_threshold must be in (0, 1), got {a.anchor_similarity_threshold}")
    a.arms = a.arms or default_arms()
    a.warmup_fail_soft = a.quick
    if a.quick:  # a smoke run never touches a headline seed
        a.seeds = a.seeds[:1] if a.seeds_given else [0]
        a.iterations = min(a.iterations, 3)
        a.eval_every = a.eval_every_early = 1
        a.eval_tasks = min(a.eval_tasks, 16)
        a.warmup_steps = min(a.warmup_steps, 100)
        a.warmup_balance_steps = min(a.warmup_balance_steps, 50)
        a.warmup_max_steps = min(a.warmup_max_steps, 300 + a.warmup_balance_steps)  # room for one balance round
        a.warmup_check = min(a.warmup_check, 256)
    try:
        eval_schedule(a.iterations, a.eval_every, a.eval_every_early)
    except ValueError as e:
        p.error(str(e))
    missing = [arm for arm in a.arms if any(k not in {f.name for f in dataclasses.fields(GiGPOConfig)}
                                            for k in ARMS[arm])]
    if missing and not a.report_only:
        p.error(f"--arms {' '.join(missing)}: this GiGPOConfig lacks the fields {[ARMS[m] for m in missing]}")
    return a


def default_results_dir(a, seeds) -> str:
    """benchmarks/results only for a complete headline report (corridor, the 10 HEADLINE_SEEDS, default budget),
    so a partial or quick run never overwrites the committed results; OUTPUT_DIR otherwise."""
    if a.results_dir is not None:
        return a.results_dir
    if a.condition is not None:
        cell = (not a.quick and sorted(seeds) == sorted(MAP_SEEDS)
                and a.iterations == CONDITIONS[a.condition]["iterations"] and a.eval_tasks == MAP_EVAL_TASKS)
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "map", a.condition)
        return root if cell else a.output_dir
    headline = (not a.quick and a.testbed == "corridor" and sorted(seeds) == sorted(HEADLINE_SEEDS)
                and a.iterations == TESTBEDS["corridor"]["iterations"])
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "results") if headline else a.output_dir


def main(argv=None) -> int:
    import datasets
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    a = parse_args(argv)
    if a.map_report:
        return map_report(a.map_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "map"))
    if a.report_only:
        return report_only(a)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")) or 1)
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    env_factory = env_factory_for(a)
    env = env_factory()
    print(f"settings: {json.dumps(vars(a))}", flush=True)
    tok = make_tokenizer(a, env_factory, a.vocab)
    train_ds = env.tasks("train").select(range(a.train_tasks))
    eval_ds = env.tasks("eval").select(range(a.eval_tasks))
    train_tasks = list(train_ds["task"])
    shared = set(train_tasks) & set(eval_ds["task"])
    print(f"tasks: {len(train_tasks)} train, {len(eval_ds)} held-out eval, {len(shared)} shared", flush=True)
    msgs, _ = random_prompt_messages(env, random.Random(0), train_tasks, a.history_length, a.walk_turns,
                                     instruction_for(a), a.max_turns)
    sample = _ids(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
    word = env.action_words[0]
    print(f"tokenizer: {len(tok)} tokens; a prompt is ~{len(sample)} tokens, a completion "
          f"{len(tok.encode(completion_text(word, a.think)))} + eos", flush=True)
    print(f"evaluations at iterations 0, {', '.join(map(str, eval_schedule(a.iterations, a.eval_every, a.eval_every_early)))}"
          f" (greedy too at 0 and the last 3)", flush=True)

    warm = functools.partial(warm_up_seed, a=a, tok=tok, env_factory=env_factory, train_tasks=train_tasks, out=out)
    # GiGPO and GRPO of every seed first (they run side by side on the two workers), further arms after them, so a
    # run cut short still has the main comparison on as many seeds as possible (see --report_only).
    first = [arm for arm in a.arms if arm in ("GiGPO", "GRPO")]
    jobs = [(seed, arm) for seed in a.seeds for arm in first] + [
        (seed, arm) for arm in a.arms if arm not in first for seed in a.seeds]
    job = functools.partial(arm_job, a=a, tok=tok, env_factory=env_factory, train_ds=train_ds, eval_ds=eval_ds,
                            out=out)
    runs_log = out / "runs.jsonl"  # one line per finished (seed, arm) run, so a cut run still has its results

    def record(result):
        with runs_log.open("a") as f:
            f.write(json.dumps(result, default=float) + "\n")
        return result

    def check_warmups(warmups):
        (out / "warmups.json").write_text(json.dumps({str(k): v for k, v in warmups.items()}, default=float))
        print("\nwarm-ups:")
        for seed in a.seeds:
            print(f"  seed {seed:>4}: {warmup_line(warmups[seed])}")
        failed = [seed for seed in a.seeds if warmups[seed].get("failed")]
        print(f"warm-up wall time {time.perf_counter() - t_all:.0f}s", flush=True)
        if failed and not a.quick:
            raise SystemExit(f"warm-up failed on seed(s) {failed}: " + "; ".join(warmups[s]["failed"] for s in failed))

    pool = None
    if a.workers > 1:
        import multiprocessing as mp

        pool = mp.get_context("fork").Pool(min(a.workers, max(len(jobs), len(a.seeds))))
    try:
        warmups = dict(zip(a.seeds, (pool.map(warm, a.seeds, chunksize=1) if pool else map(warm, a.seeds))))
        check_warmups(warmups)
        if a.warmup_only:
            return 0
        runs_log.write_text("")
        for result in (pool.imap_unordered(job, jobs, chunksize=1) if pool else map(job, jobs)):
            record(result)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    (out / "invocation.json").write_text(json.dumps({"seeds": a.seeds, "arms": a.arms,
                                                     "wall_seconds": time.perf_counter() - t_all}))
    results = load_runs([runs_log])
    seeds = [s for s in a.seeds if all((s, arm) in results for arm in a.arms)]
    res_dir = Path(default_results_dir(a, seeds))
    res_dir.mkdir(parents=True, exist_ok=True)
    write_report(a, results, seeds, warmups, time.perf_counter() - t_all, res_dir)
    return 0


# Settings the map (issue 35) added to RUN_KEYS, at the values that reproduce the runs made before them: a run
# whose run_settings lack them was made with these, so it merges with a new run of the same protocol.
MAP_KEY_DEFAULTS = {"nuisance": None, "trap_door": False, "condition": None, "anchor_drops_nuisance": False,
                    "anchor_similarity_threshold": None}


def run_settings_filled(settings: dict | None) -> dict | None:
    """``settings`` with every key of ``MAP_KEY_DEFAULTS`` it lacks set to that default (None stays None)."""
    return None if settings is None else MAP_KEY_DEFAULTS | settings


def load_runs(paths) -> dict:
    """The (seed, arm) runs of several runs.jsonl files, keyed (seed, arm). Raises ValueError when a (seed, arm)
    appears twice or when runs were made with different ``RUN_KEYS`` settings (they would not be comparable)."""
    results, where = {}, {}
    for path in map(Path, paths):
        if not path.exists():
            raise ValueError(f"runs file {path} does not exist")
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            r = json.loads(line)
            # recomputed from the stored series, so runs written before a fix to iters_to report the fixed figure
            r["iters_to_50pct_train"] = iters_to(r["series"]["episode/success_rate"])
            key = (r["seed"], r["arm"])
            if key in results:
                raise ValueError(f"seed {key[0]} arm {key[1]} appears twice: {where[key]} and {path}:{n}")
            results[key], where[key] = r, f"{path}:{n}"
    settings = {json.dumps(run_settings_filled(r.get("run_settings")), sort_keys=True): k for k, r in results.items()}
    if len(settings) > 1:
        raise ValueError("the runs were made with different settings; not merging: "
                         + " vs ".join(f"{where[k]}: {s}" for s, k in settings.items()))
    return results


def report_only(a) -> int:
    """--report_only: merge the runs (and warm-up figures) of ``a.runs`` and write the report."""
    paths = [Path(p) for p in (a.runs or [Path(a.output_dir) / "runs.jsonl"])]
    results = load_runs(paths)
    warmups, wall = {}, 0.0
    for path in paths:
        w = path.parent / "warmups.json"
        if w.exists():
            for seed, stats in json.loads(w.read_text()).items():
                warmups.setdefault(str(seed), stats)
        inv = path.parent / "invocation.json"
        wall += json.loads(inv.read_text())["wall_seconds"] if inv.exists() else float("nan")
    arms = [arm for arm in ARMS if arm in a.arms and any(k[1] == arm for k in results)]
    if not a.seeds_given:
        a.seeds = sorted({s for s, _ in results})
    a.arms = arms
    seeds = [s for s in a.seeds if all((s, arm) in results for arm in arms)]
    if results:  # the merged runs' own settings, not this invocation's defaults
        for k, v in (next(iter(results.values())).get("run_settings") or {}).items():
            setattr(a, k, v)
    res_dir = Path(default_results_dir(a, seeds))
    res_dir.mkdir(parents=True, exist_ok=True)
    return write_report(a, results, seeds, warmups, wall, res_dir)


def write_report(a, results, seeds, warmups, total, res_dir, plot_curves=True) -> int:
    """Print the report of ``results`` over ``seeds`` (those with every arm of ``a.arms``) and write
    ``res_dir/learning.json`` (and the plot). Returns 0, or 1 when no seed has every arm."""
    if len(seeds) < len(a.seeds):
        print(f"runs finished for all arms on seeds {seeds} only (of {a.seeds}); the report covers those")
    reference_seeds = MAP_SEEDS if getattr(a, "condition", None) else HEADLINE_SEEDS
    missing_headline = [s for s in reference_seeds if s not in seeds]
    if a.testbed == "corridor" and missing_headline:
        print(f"not a {'map cell' if reference_seeds is MAP_SEEDS else 'headline'} report: seeds {missing_headline} "
              "missing")
    if not seeds:
        return 1
    warmups = {str(k): v for k, v in warmups.items()}
    table, gaps = report(results, seeds, a.arms, a, warmups)
    print()
    print(table)
    print(f"\ntotal wall time: {total:.0f}s ({a.workers} worker processes)")
    main_gap = gaps.get(f"GiGPO-GRPO/{METRICS[PRIMARY_METRIC][0]}")
    auc_gap = gaps.get("GiGPO-GRPO/AUC T=1")

    def warm_figures(s):
        w = warmups.get(str(s), {})
        return {k: w.get(k) for k in ("legal", "leads_on_among_two_legal", "n_two_door", "steps", "rules_steps",
                                      "balance_rounds", "restarts", "init_seed", "seconds", "cpu_seconds", "valid_format", "failed")
                if k in w}

    payload = {
        **provenance(),  # command, commit, date, machine
        "gap_pp": main_gap["gap_pp"] if main_gap else None,
        "ci95_pp": main_gap["ci95_pp"] if main_gap else None,
        "primary_metric": {"key": PRIMARY_METRIC, "gap": f"GiGPO-GRPO/{METRICS[PRIMARY_METRIC][0]}",
                           "description": METRICS[PRIMARY_METRIC][1], "fixed": "before the headline run"},
        "auc_gap_pp": auc_gap["gap_pp"] if auc_gap else None,
        "auc_ci95_pp": auc_gap["ci95_pp"] if auc_gap else None,
        "seeds": seeds,
        "headline_seeds": HEADLINE_SEEDS,
        "is_headline": (a.testbed == "corridor" and not missing_headline and not a.quick
                        and not getattr(a, "condition", None)),
        "condition": getattr(a, "condition", None),
        "is_map_cell": bool(getattr(a, "condition", None)) and not missing_headline and not a.quick,
        "headline": (f"GiGPO - GRPO held-out success on {a.testbed} (sampled T=1, mean of the last 3 evaluations, "
                     f"{len(seeds)} seeds, paired): {main_gap['gap_pp']:+.1f} pp, 95% t interval "
                     f"[{main_gap['ci95_pp'][0]:+.1f}, {main_gap['ci95_pp'][1]:+.1f}]; area under the held-out "
                     f"success curve: {auc_gap['gap_pp']:+.1f} pp [{auc_gap['ci95_pp'][0]:+.1f}, "
                     f"{auc_gap['ci95_pp'][1]:+.1f}]") if main_gap else None,
        "gaps": gaps,
        "per_seed": {str(s): {arm: {k: results[(s, arm)][k] for k in (
            "headline_sampled", "headline_greedy", "auc_sampled", "iters_to_50pct_train", "env_steps",
            "generated_tokens", "wall_seconds")} for arm in a.arms} | {"warmup": warm_figures(s)} for s in seeds},
        "settings": vars(a), "arms": {arm: ARMS[arm] for arm in a.arms}, "warmup": warmups,
        "total_seconds": total, "runs": [results[(s, arm)] for s in seeds for arm in a.arms], "table": table,
    }
    (res_dir / "learning.json").write_text(json.dumps(payload, indent=1, default=float))
    if plot_curves:
        plot(results, seeds, a.arms, a, res_dir / "learning_curve.png")
    print(f"json: {res_dir / 'learning.json'}")
    return 0


def map_table(cells: dict) -> tuple[str, dict]:
    """The map's table: per condition (``cells``: condition -> its learning.json) and arm, the paired gap to GRPO
    of the primary metric and its 95 % t interval. Returns (text, {condition: {arm: gap_stats dict}})."""
    label = METRICS[PRIMARY_METRIC][0]
    rows, out = [], {}
    head = f"{'condition':<11} {'seeds':>5} " + " ".join(f"{arm + ' - GRPO':>24}" for arm in ARMS if arm != "GRPO")
    rows += [f"gap to GRPO, {METRICS[PRIMARY_METRIC][1]} (pp, 95% t interval over seeds):", head, "-" * len(head)]
    for cond in CONDITIONS:
        if cond not in cells:
            continue
        d = cells[cond]
        out[cond] = {}
        cols = []
        for arm in ARMS:
            if arm == "GRPO":
                continue
            g = d["gaps"].get(f"{arm}-GRPO/{label}")
            if g is None:
                cols.append(f"{'-':>24}")
                continue
            out[cond][arm] = g
            cols.append(f"{g['gap_pp']:+6.1f} [{g['ci95_pp'][0]:+6.1f}, {g['ci95_pp'][1]:+6.1f}]".rjust(24))
        rows.append(f"{cond:<11} {len(d['seeds']):>5} " + " ".join(cols))
    return "\n".join(rows), out


def map_report(map_dir) -> int:
    """--map_report: read ``map_dir/CONDITION/learning.json`` of every cell present, print the table, write
    ``map_dir/map.json`` and the figure ``map_dir/map.png`` (gap to GRPO with its 95 % interval per arm, one panel
    per axis of ``MAP_AXES``). Returns 1 when no cell is there."""
    map_dir = Path(map_dir)
    cells = {c: json.loads((map_dir / c / "learning.json").read_text()) for c in CONDITIONS
             if (map_dir / c / "learning.json").exists()}
    if not cells:
        print(f"no cell of the map under {map_dir} (expected {map_dir}/CONDITION/learning.json)")
        return 1
    missing = [c for c in CONDITIONS if c not in cells]
    partial = [c for c, d in cells.items() if not d.get("is_map_cell")]
    table, gaps = map_table(cells)
    print(table)
    if missing:
        print(f"cells missing: {missing}")
    if partial:
        print(f"cells that are not complete map cells (seeds, iterations or eval tasks differ): {partial}")
    (map_dir / "map.json").write_text(json.dumps({
        **provenance(),
        "primary_metric": PRIMARY_METRIC, "gaps_to_grpo": gaps, "missing": missing, "partial": partial,
        "seeds": {c: d["seeds"] for c, d in cells.items()}, "table": table}, indent=1, default=float))
    plot_map(gaps, map_dir / "map.png")
    print(f"json: {map_dir / 'map.json'}")
    return 0


def plot_map(gaps: dict, path) -> None:
    """One panel per axis of ``MAP_AXES``: for each cell present, each arm's gap to GRPO (pp) with its 95 %
    interval as an error bar, arms side by side; a dashed line at 0 (= GRPO)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"GiGPO": "tab:blue", "HGPO": "tab:green", "GraphGPO": "tab:red"}
    arms = [arm for arm in ARMS if arm != "GRPO"]
    fig, axes = plt.subplots(1, len(MAP_AXES), figsize=(5 * len(MAP_AXES), 4.2), sharey=True)
    for ax, (axis, conds) in zip(axes, MAP_AXES.items()):
        conds = [c for c in conds if c in gaps]
        for j, arm in enumerate(arms):
            xs, ms, los, his = [], [], [], []
            for i, c in enumerate(conds):
                g = gaps[c].get(arm)
                if g is None:
                    continue
                lo, hi = g["ci95_pp"]
                xs.append(i + (j - (len(arms) - 1) / 2) * 0.18)
                ms.append(g["gap_pp"])
                los.append(g["gap_pp"] - lo if np.isfinite(lo) else 0.0)
                his.append(hi - g["gap_pp"] if np.isfinite(hi) else 0.0)
            if xs:
                ax.errorbar(xs, ms, yerr=[los, his], fmt="o", capsize=4, color=colors[arm], label=arm)
        ax.axhline(0.0, color="tab:orange", ls="--", lw=1, label="GRPO")
        ax.set_xticks(range(len(conds)))
        ax.set_xticklabels([MAP_AXIS_LABELS.get((axis, c), CONDITIONS[c]["label"]) for c in conds])
        ax.set(title=f"against {axis}", xlim=(-0.6, max(len(conds), 1) - 0.4))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"gap to GRPO, pp ({METRICS[PRIMARY_METRIC][0]}, last 3 evaluations)")
    axes[0].legend(loc="best")
    fig.suptitle("Where step credit pays: gap to GRPO per arm, mean and 95% t interval over seeds (corridor)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    raise SystemExit(main())
