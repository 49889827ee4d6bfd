"""GiGPO (omega = 1) vs GRPO (omega = 0) at equal budget on procedural FrozenLake, on a CPU.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/learning.py            # full run (3 seeds)
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python benchmarks/learning.py --quick    # ~1-minute smoke version

Per seed:

1. a tiny Qwen2 policy (random init, compact BPE tokenizer trained offline on FrozenLake prompts) gets a short
   supervised *format* warm-up: real prompts from ``gigpo_trl.prompts.build_messages`` + the chat template,
   targets ``<think>go</think><action>{move}</action>`` with the move drawn uniformly among the state's *safe*
   moves (no edge bump, no hole; ``--warmup_targets random``: any move). It knows the rules, nothing about where
   the goal is; the weights are saved once and loaded by both arms. (With uniformly random targets the policy
   learns to ignore the prompt entirely, and RL from there never made it depend on the map again.)
2. the same weights are trained twice with identical settings, seeds, task order and number of iterations,
   once with ``step_advantage_weight=1.0`` (GiGPO) and once with ``0.0`` (GRPO);
3. both are evaluated (greedy, ``eval_temperature=0``, the headline) on held-out maps (the env's eval split)
   before training and after each quarter of training; also sampled at ``--sampled_eval_temperature``
   (default 1) on the same maps.

The observation (``--prompt local``, default) is the env's grid plus one line naming what each move leads to
(``up edge, down ice, left hole, right ice``): a deterministic function of the state; the anchor state stays
the env's own grid text, so maps, dynamics, rewards and anchor groups are FrozenLakeEnv's.
``--workers 2`` (default) runs the warm-ups and then the six (seed, arm) runs in two single-threaded processes.

Prints a table (per seed and mean: success before training, after each quarter, final, wall seconds) plus the
anchor-group statistics the trainer logged, and writes ``learning.json`` (all numbers, per-iteration training
logs included) and ``learning_curve.png`` to ``--output_dir``.
"""

from __future__ import annotations

import argparse
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

from gigpo_trl import GiGPOConfig, GiGPOTrainer  # noqa: E402
from gigpo_trl.envs.frozenlake import ACTION_NAMES, INSTRUCTION, FrozenLakeEnv  # noqa: E402
from gigpo_trl.models import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from gigpo_trl.prompts import build_messages  # noqa: E402

ARMS = {"GiGPO": 1.0, "GRPO": 0.0}

# A shorter prompt than FrozenLakeEnv's own (~60 instead of ~215 tokens with this tokenizer), so a 2-core CPU
# can afford the run; same maps, dynamics, rewards and anchors (the observation). --prompt full uses the env's.
COMPACT_SYSTEM = "FrozenLake. P is you, O a hole, G the goal. Answer <think>go</think><action>MOVE</action>."
COMPACT_TEMPLATE = "{history}Map:\n{observation}\nMove up, down, left or right."


class CompactFrozenLake(FrozenLakeEnv):
    """FrozenLakeEnv with a compact prompt (only ``system_prompt`` / ``prompt_template`` differ)."""

    system_prompt = COMPACT_SYSTEM
    prompt_template = COMPACT_TEMPLATE


CELL_NAMES = {"S": "ice", "F": "ice", "H": "hole", "G": "goal"}


class LocalViewFrozenLake(CompactFrozenLake):
    """CompactFrozenLake whose observation text adds one line spelling out what each move leads to, e.g.
    ``up edge, down ice, left edge, right hole`` after the env's grid. The line is a deterministic function of
    the state (map and position), which the grid already determines, and ``anchor_state`` returns the env's own
    grid text, so maps, dynamics, rewards and anchor groups are exactly FrozenLakeEnv's; only the text the
    policy reads is richer (a 2-layer model finds ``P``'s neighbours in a flattened 2-D grid only slowly)."""

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
        return "\n".join(str(observation).split("\n")[: self.size])  # the env's own observation (the grid)
TAGS = ["<think>", "</think>", "<action>", "</action>"]
THINK = "go"


def completion_text(move: str) -> str:
    return f"<think>{THINK}</think><action>{move}</action>"


# ---------------------------------------------------------------------------------------------- prompts
def random_prompt_messages(env: FrozenLakeEnv, rng: random.Random, map_ids, history_length: int):
    """Messages of a prompt the collector could build: a random state reached by a random walk on a train map,
    with the last <= ``history_length`` (observation, move) pairs of that walk."""
    env.reset(task=rng.choice(map_ids), seed=0)
    history = []
    obs = env.render()
    n = rng.randrange(env.max_turns)
    for _ in range(n):
        move = rng.choice(ACTION_NAMES)
        prev_pos = env.pos
        new_obs, _, done, _ = env.step(move)
        if done:
            env.pos = prev_pos  # leave the scratch env in the state the prompt shows (for safe_moves)
            break
        history.append((obs, move))
        obs = new_obs
    turn = len(history)
    window = history[len(history) - min(history_length, len(history)):] if history_length else []
    return build_messages(env, INSTRUCTION, obs, window, turn, env.max_turns, list(ACTION_NAMES))


def safe_moves(env: FrozenLakeEnv) -> list[str]:
    """Moves from the env's current cell that neither bump into the edge nor step into a hole (the rules of the
    game, not the way to the goal)."""
    moves = []
    for move in ACTION_NAMES:
        r, c = env._moved(env.pos, move)
        if (r, c) != env.pos and env.grid[r][c] != "H":
            moves.append(move)
    return moves or list(ACTION_NAMES)


def make_tokenizer(env_factory, history_length: int, vocab_size: int):
    """Compact byte-level BPE trained on rendered FrozenLake prompts and completions, plus the four format tags
    as single tokens (so a completion is ~7 tokens)."""
    rng = random.Random(1234)
    env = env_factory()
    chat = build_tiny_tokenizer(["x"], vocab_size=300)  # only for its chat template
    texts = []
    for _ in range(300):
        msgs = random_prompt_messages(env, rng, range(0, 10_000), history_length)
        texts.append(chat.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
    texts += [completion_text(m) + "<|im_end|>" for m in ACTION_NAMES] * 50
    tok = build_tiny_tokenizer(texts, vocab_size=vocab_size)
    tok.add_tokens(TAGS)
    return tok


# ---------------------------------------------------------------------------------------------- warm-up
def format_warmup(model, tok, env_factory, train_maps, history_length, steps, batch_size, lr, seed,
                  targets="random"):
    """Plain cross-entropy on completion tokens in the right format. The move is uniformly random
    (``targets="random"``) or uniformly random among the prompt state's safe moves (``"safe"``: no edge bump, no
    hole; nothing about where the goal is). Returns (final loss, seconds)."""
    t0 = time.perf_counter()
    rng = random.Random(seed)
    env = env_factory()
    n_examples = steps * batch_size
    prompts, moves = [], []
    for _ in range(n_examples):
        msgs = random_prompt_messages(env, rng, train_maps, history_length)
        prompts.append(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
        moves.append(rng.choice(safe_moves(env) if targets == "safe" else ACTION_NAMES))
    prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
    eos = tok.eos_token_id
    pad_id = tok.pad_token_id
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    loss_val = float("nan")
    for step in range(steps):
        batch = prompts[step * batch_size:(step + 1) * batch_size]
        seqs, labels = [], []
        for p, move in zip(batch, moves[step * batch_size:(step + 1) * batch_size]):
            c = tok.encode(completion_text(move), add_special_tokens=False) + [eos]
            seqs.append(list(p) + c)
            labels.append([-100] * len(p) + c)
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        lab = torch.full((len(seqs), width), -100, dtype=torch.long)
        att = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (s, l) in enumerate(zip(seqs, labels)):  # left padding, as in generation
            ids[i, width - len(s):] = torch.tensor(s)
            lab[i, width - len(s):] = torch.tensor(l)
            att[i, width - len(s):] = 1
        out = model(input_ids=ids, attention_mask=att, labels=lab)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_val = out.loss.item()
    model.eval()
    return loss_val, time.perf_counter() - t0


def check_format(model, tok, env_factory, train_maps, history_length, n=64, seed=0):
    """Fraction of sampled completions that parse as a valid move, and the move histogram."""
    from gigpo_trl.parsing import parse_action

    rng = random.Random(seed + 99)
    env = env_factory()
    prompts = [tok.apply_chat_template(random_prompt_messages(env, rng, train_maps, history_length),
                                       add_generation_prompt=True, tokenize=True) for _ in range(n)]
    prompts = [p["input_ids"] if hasattr(p, "keys") else p for p in prompts]
    width = max(map(len, prompts))
    ids = torch.full((n, width), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        att[i, width - len(p):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=12, do_sample=True, top_k=0,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    parsed = [parse_action(t) for t in texts]
    valid = [p.valid and p.action in ACTION_NAMES for p in parsed]
    hist = {m: sum(p.action == m for p in parsed) for m in ACTION_NAMES}
    return float(np.mean(valid)), hist


# ---------------------------------------------------------------------------------------------- RL
class QuarterEval:
    """TrainerCallback: ``trainer.evaluate()`` after each quarter of the optimizer steps."""

    def __init__(self, eval_steps):
        from transformers import TrainerCallback

        outer = self

        class _CB(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step in outer.eval_steps and outer.trainer is not None:
                    t0 = time.perf_counter()
                    m = outer.trainer.evaluate()
                    point = {"step": state.global_step, "success": m["eval_success_rate"],
                             "return_mean": m.get("eval_return_mean"), "length_mean": m.get("eval_length_mean"),
                             "invalid_action_rate": m.get("eval_invalid_action_rate")}
                    if outer.sampled_temperature:
                        point["sampled_success"] = sampled_eval(outer.trainer, outer.sampled_temperature)
                    outer.points.append(point)
                    outer.eval_seconds += time.perf_counter() - t0
                return control

        self.callback = _CB()
        self.sampled_temperature = 0.0
        self.eval_steps = set(eval_steps)
        self.trainer = None
        self.points: list[dict] = []
        self.eval_seconds = 0.0


def sampled_eval(trainer, temperature: float) -> float:
    """Eval success when sampling at ``temperature`` (the same held-out maps; a secondary, noisier metric)."""
    saved = trainer.args.eval_temperature
    trainer.args.eval_temperature = temperature
    try:
        return trainer.evaluate(metric_key_prefix="eval_sampled")["eval_sampled_success_rate"]
    finally:
        trainer.args.eval_temperature = saved


def make_config(a, out_dir: str, omega: float, seed: int) -> GiGPOConfig:
    return GiGPOConfig(
        output_dir=out_dir, seed=seed, data_seed=seed, step_advantage_weight=omega,
        num_generations=a.num_generations, per_device_train_batch_size=a.groups * a.num_generations // a.spg,
        steps_per_generation=a.spg, max_steps=a.iterations * a.spg, max_turns=a.max_turns,
        history_length=a.history_length, learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, temperature=a.temperature, top_k=0, top_p=1.0,
        max_completion_length=a.max_completion_length, gamma=a.gamma, advantage_mode=a.advantage_mode,
        bf16=False, gradient_checkpointing=False, use_cpu=True, report_to="none", save_strategy="no",
        disable_tqdm=True, logging_steps=1, eval_max_tasks=a.eval_tasks, eval_temperature=0.0,
        per_device_eval_batch_size=a.num_generations,
    )


def summarize_logs(log_history) -> dict:
    keys = ["anchor/singleton_fraction", "anchor/row_group_size_mean", "anchor/group_size_mean",
            "episode/success_rate", "episode/length_mean", "episode/invalid_action_rate", "rollout/rows",
            "rollout/seconds", "rollout/advantage_seconds"]
    series = {k: [e[k] for e in log_history if k in e] for k in keys}
    return {k: (float(np.mean(v)) if v else None) for k, v in series.items()}, series


def run_arm(a, name, omega, seed, init_dir, tok, env_factory, train_ds, eval_ds, base_eval):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(init_dir)
    quarter = max(1, a.iterations // 4)
    eval_steps = [q * quarter * a.spg for q in (1, 2, 3)] + [a.iterations * a.spg]
    cb = QuarterEval(eval_steps)
    cb.sampled_temperature = a.sampled_eval_temperature
    args = make_config(a, str(Path(a.output_dir) / f"seed{seed}" / name), omega, seed)
    trainer = GiGPOTrainer(model, env=env_factory, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                           processing_class=tok, callbacks=[cb.callback])
    cb.trainer = trainer
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # the per-step log dicts; everything is kept in log_history
    if base_eval is None:
        t0 = time.perf_counter()
        base_eval = {"greedy": trainer.evaluate()["eval_success_rate"]}
        if a.sampled_eval_temperature:
            base_eval["sampled"] = sampled_eval(trainer, a.sampled_eval_temperature)
        print(f"  seed {seed} {name:5s}: eval success before RL = {base_eval} ({time.perf_counter() - t0:.1f}s)",
              flush=True)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    means, series = summarize_logs(trainer.state.log_history)
    trainer.collector.close()
    result = {
        "arm": name, "omega": omega, "seed": seed, "base": base_eval["greedy"],
        "base_sampled": base_eval.get("sampled"),
        "quarters": [p["success"] for p in cb.points], "points": cb.points,
        "sampled_quarters": [p.get("sampled_success") for p in cb.points],
        "final": cb.points[-1]["success"] if cb.points else float("nan"),
        "wall_seconds": wall, "eval_seconds": cb.eval_seconds, "train_seconds": wall - cb.eval_seconds,
        "log_means": means, "train_success_series": series["episode/success_rate"],
        "singleton_series": series["anchor/singleton_fraction"],
        "row_group_size_series": series["anchor/row_group_size_mean"],
        "eval_steps": eval_steps,
    }
    if a.sampled_eval_temperature:
        print(f"  seed {seed} {name:5s}: sampled-eval quarters "
              f"{' '.join(f'{q:.3f}' for q in result['sampled_quarters'])}", flush=True)
    print(f"  seed {seed} {name:5s}: quarters {' '.join(f'{q:.3f}' for q in result['quarters'])}  "
          f"train-success {means['episode/success_rate']:.3f}  singleton {means['anchor/singleton_fraction']:.3f}"
          f"  row-group {means['anchor/row_group_size_mean']:.2f}  wall {wall:.0f}s (eval {cb.eval_seconds:.0f}s)",
          flush=True)
    return result, base_eval


def warm_up_seed(a, seed, tok, env_factory, train_maps, out):
    """Format warm-up of one seed's policy; the weights are saved to ``out/seed{seed}/init`` for both arms."""
    torch.set_num_threads(1)
    model = build_tiny_model(tok, hidden_size=a.hidden, num_layers=a.layers, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    loss, secs = format_warmup(model, tok, env_factory, train_maps, a.history_length, a.warmup_steps,
                               a.warmup_batch, a.warmup_lr, seed, a.warmup_targets)
    valid, hist = check_format(model, tok, env_factory, train_maps, a.history_length, seed=seed)
    init_dir = out / f"seed{seed}" / "init"
    model.save_pretrained(init_dir)
    tok.save_pretrained(init_dir)
    print(f"seed {seed}: {n_params / 1e3:.0f}k params; warm-up {a.warmup_steps} steps in {secs:.0f}s, "
          f"loss {loss:.3f} (uniform moves: ~{np.log(4) / 7:.3f}/token), sampled valid format {valid:.2f}, "
          f"moves {hist}", flush=True)
    return {"loss": loss, "seconds": secs, "valid_format": valid, "moves": hist, "params": n_params}


def arm_job(job, a, tok, env_factory, train_ds, eval_ds, out):
    """One (seed, arm) training run from the seed's saved warm-up weights. Each arm evaluates the start itself
    (same weights, same RNG state, so both arms see the same start and then the same training RNG stream)."""
    seed, arm = job
    torch.set_num_threads(1)
    result, _ = run_arm(a, arm, ARMS[arm], seed, str(out / f"seed{seed}" / "init"), tok, env_factory, train_ds,
                        eval_ds, None)
    return result


# ---------------------------------------------------------------------------------------------- report
def _table(results, seeds, key_q, key_base, title):
    head = f"{'seed':>4} {'arm':6} {'start':>6} {'Q1':>6} {'Q2':>6} {'Q3':>6} {'final':>6} {'wall s':>7}"
    lines = [title, head, "-" * len(head)]
    for seed in seeds:
        for arm in ARMS:
            r = results[(seed, arm)]
            lines.append(f"{seed:>4} {arm:6} {r[key_base]:6.3f} " + " ".join(f"{x:6.3f}" for x in r[key_q])
                         + f" {r['wall_seconds']:7.0f}")
    lines.append("-" * len(head))
    for arm in ARMS:
        rs = [results[(s, arm)] for s in seeds]
        q = np.mean([r[key_q] for r in rs], axis=0)
        lines.append(f"{'mean':>4} {arm:6} {np.mean([r[key_base] for r in rs]):6.3f} "
                     + " ".join(f"{x:6.3f}" for x in q) + f" {np.mean([r['wall_seconds'] for r in rs]):7.0f}")
    gaps = [100 * (results[(s, "GiGPO")][key_q][-1] - results[(s, "GRPO")][key_q][-1]) for s in seeds]
    lines.append("GiGPO - GRPO final (percentage points): "
                 + ", ".join(f"seed {s}: {g:+.1f}" for s, g in zip(seeds, gaps)) + f"; mean {np.mean(gaps):+.1f}")
    return lines, float(np.mean(gaps))


def print_table(results, seeds, sampled_t=1.0):
    lines, gap = _table(results, seeds, "quarters", "base",
                        "held-out eval success, greedy (eval_temperature=0), after each quarter of training:")
    lines.append(f"target: mean gap >= +10 pp -> {'PASS' if gap >= 10 else 'MISS'}")
    if results[(seeds[0], "GiGPO")]["sampled_quarters"][0] is not None:
        more, sgap = _table(results, seeds, "sampled_quarters", "base_sampled",
                            f"held-out eval success, sampled (temperature {sampled_t:g}), same maps:")
        lines += [""] + more
    lines.append("")
    h2 = f"{'seed':>4} {'arm':6} {'train-succ':>10} {'singleton':>9} {'row-grp':>7} {'grp-mean':>8} {'rows/it':>7} {'len':>5}"
    lines += ["anchor-group statistics (means over the run's logged iterations):", h2]
    for seed in seeds:
        for arm in ARMS:
            m = results[(seed, arm)]["log_means"]
            lines.append(f"{seed:>4} {arm:6} {m['episode/success_rate']:10.3f} {m['anchor/singleton_fraction']:9.3f} "
                         f"{m['anchor/row_group_size_mean']:7.2f} {m['anchor/group_size_mean']:8.2f} "
                         f"{m['rollout/rows']:7.0f} {m['episode/length_mean']:5.2f}")
    return "\n".join(lines), gap


def plot(results, seeds, a, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install matplotlib): no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = {"GiGPO": "tab:blue", "GRPO": "tab:orange"}
    for arm in ARMS:
        xs = [0] + [s // a.spg for s in results[(seeds[0], arm)]["eval_steps"]]
        ys = np.array([[results[(s, arm)]["base"]] + results[(s, arm)]["quarters"] for s in seeds])
        for row in ys:
            axes[0].plot(xs, row, color=colors[arm], alpha=0.25, lw=1)
        axes[0].plot(xs, ys.mean(0), color=colors[arm], lw=2.5, marker="o", label=f"{arm} (ω={ARMS[arm]:g}) greedy")
        if results[(seeds[0], arm)]["sampled_quarters"][0] is not None:
            ys = np.array([[results[(s, arm)]["base_sampled"]] + results[(s, arm)]["sampled_quarters"] for s in seeds])
            axes[0].plot(xs, ys.mean(0), color=colors[arm], lw=1.5, ls="--", marker="s",
                         label=f"{arm} sampled T={a.sampled_eval_temperature:g}")
        tr = [np.asarray(results[(s, arm)]["train_success_series"]) for s in seeds]
        n = min(map(len, tr))
        if n:
            m = np.mean([t[:n] for t in tr], axis=0)
            k = max(1, n // 15)
            sm = np.convolve(m, np.ones(k) / k, mode="valid")
            axes[1].plot(np.arange(len(sm)) + k - 1, sm, color=colors[arm], lw=2, label=arm)
    axes[0].set(xlabel="training iteration", ylabel="held-out eval success",
                title=f"FrozenLake {a.map_size}x{a.map_size}, {len(seeds)} seeds (thin: per seed)")
    axes[1].set(xlabel="training iteration (logged)", ylabel="training rollout success (sampled)",
                title="training success, moving average")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="~1-minute smoke version (1 seed, 8 iterations, 32 eval maps)")
    p.add_argument("--output_dir", default="outputs/bench/learning")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--iterations", type=int, default=100, help="rollout/update iterations per arm")
    p.add_argument("--groups", type=int, default=8, help="task groups per iteration")
    p.add_argument("--num_generations", type=int, default=8, help="rollouts per group (N)")
    p.add_argument("--spg", type=int, default=4, help="steps_per_generation (optimizer steps per iteration)")
    p.add_argument("--map_size", type=int, default=4)
    p.add_argument("--p", type=float, default=0.8, help="FrozenLake: probability that a cell is frozen")
    p.add_argument("--max_turns", type=int, default=10)
    p.add_argument("--prompt", default="local", choices=["compact", "local", "full"],
                   help="compact: short prompt, env's grid observation; local: compact + one line naming what "
                        "each move leads to (anchors stay the env's grid); full: the env's own prompt")
    p.add_argument("--history_length", type=int, default=0)
    p.add_argument("--train_maps", type=int, default=64, help="size of the fixed training map set")
    p.add_argument("--eval_tasks", type=int, default=100, help="held-out eval maps")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.95)
    p.add_argument("--advantage_mode", default="mean_norm", choices=["mean_norm", "mean_std_norm"])
    p.add_argument("--max_completion_length", type=int, default=10)
    p.add_argument("--sampled_eval_temperature", type=float, default=1.0,
                   help="also evaluate by sampling at this temperature (0: greedy only)")
    p.add_argument("--workers", type=int, default=2,
                   help="(seed, arm) runs in parallel processes (each single-threaded); 1 = one after another")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=600)
    p.add_argument("--warmup_steps", type=int, default=1000)
    p.add_argument("--warmup_batch", type=int, default=32)
    p.add_argument("--warmup_lr", type=float, default=3e-3)
    p.add_argument("--warmup_targets", default="safe", choices=["safe", "random"],
                   help="warm-up move targets: random among the moves that stay on the ice (safe) or uniformly "
                        "random (random: the policy learns to ignore the prompt)")
    a = p.parse_args(argv)
    if a.quick:
        a.seeds = a.seeds[:1]
        a.iterations = min(a.iterations, 8)
        a.eval_tasks = min(a.eval_tasks, 32)
        a.warmup_steps = min(a.warmup_steps, 300)
    return a


def main(argv=None) -> int:
    import datasets
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()
    a = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")) or 1)
    out = Path(a.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    env_cls = {"compact": CompactFrozenLake, "local": LocalViewFrozenLake, "full": FrozenLakeEnv}[a.prompt]
    env_factory = functools.partial(env_cls, size=a.map_size, p=a.p, max_turns=a.max_turns)
    env = env_factory()
    print(f"settings: {json.dumps(vars(a))}", flush=True)

    tok = make_tokenizer(env_factory, a.history_length, a.vocab)
    train_ds = env.tasks("train").select(range(a.train_maps))
    eval_ds = env.tasks("eval").select(range(a.eval_tasks))
    train_maps = list(train_ds["task"])
    from gigpo_trl.envs.frozenlake import generate_map

    train_layouts = {generate_map(m, a.map_size, a.p) for m in train_maps}
    overlap = sum(generate_map(m, a.map_size, a.p) in train_layouts for m in eval_ds["task"])
    print(f"maps: {len(train_maps)} train ids ({len(train_layouts)} distinct layouts), {len(eval_ds)} held-out eval "
          f"ids, of which {overlap} have a layout that also occurs in the train set", flush=True)
    sample = tok.apply_chat_template(random_prompt_messages(env, random.Random(0), train_maps, a.history_length),
                                     add_generation_prompt=True, tokenize=True)
    sample = sample["input_ids"] if hasattr(sample, "keys") else sample
    print(f"tokenizer: {len(tok)} tokens; a prompt is ~{len(sample)} tokens, a completion "
          f"{len(tok.encode(completion_text('right')))} + eos", flush=True)

    warm = functools.partial(warm_up_seed, a, tok=tok, env_factory=env_factory, train_maps=train_maps, out=out)
    jobs = [(seed, arm) for seed in a.seeds for arm in ARMS]
    job = functools.partial(arm_job, a=a, tok=tok, env_factory=env_factory, train_ds=train_ds, eval_ds=eval_ds,
                            out=out)
    if a.workers > 1:  # warm-ups, then (seed, arm) runs, in parallel processes, each single-threaded
        import multiprocessing as mp

        with mp.get_context("fork").Pool(min(a.workers, len(jobs))) as pool:
            warmups = dict(zip(a.seeds, pool.map(warm, a.seeds, chunksize=1)))
            done = pool.map(job, jobs, chunksize=1)
    else:
        warmups = {seed: warm(seed) for seed in a.seeds}
        done = [job(j) for j in jobs]
    results = dict(zip(jobs, done))

    table, gap = print_table(results, a.seeds, a.sampled_eval_temperature)
    total = time.perf_counter() - t_all
    print()
    print(table)
    print(f"\ntotal wall time: {total:.0f}s")
    payload = {"settings": vars(a), "warmup": warmups, "total_seconds": total, "mean_gap_pp": gap,
               "results": [results[(s, arm)] for s in a.seeds for arm in ARMS]}
    (out / "learning.json").write_text(json.dumps(payload, indent=1, default=float))
    (out / "learning_table.txt").write_text(table + f"\n\ntotal wall time: {total:.0f}s\n")
    plot(results, a.seeds, a, out / "learning_curve.png")
    print(f"json: {out / 'learning.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
