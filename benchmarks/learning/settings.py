"""The learning benchmark's settings and command line: the arms, the seeds, the testbeds' settings, the map's
conditions, ``parse_args`` and where the results go. Imports nothing heavy, so ``--help`` answers at once."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from .statistics import eval_schedule

RESULTS = Path(__file__).resolve().parent.parent / "results"


# The arms: GiGPOConfig fields that differ between them (everything else is shared).
ARMS = {
    "GiGPO": {"step_advantage_weight": 1.0},
    "GRPO": {"step_advantage_weight": 0.0},
    "HGPO": {"step_advantage_weight": 1.0, "step_grouping": "hierarchical", "hierarchy_depth": 2},
    # the recipe's ALFWorld run script: gamma 0.10 (its WebShop script: 0.20), distance form off
    "GraphGPO": {"step_advantage_weight": 1.0, "step_return": "graph", "gamma": 0.1, "graph_normalize_distance": False},
    # the corridor's success reward (1.0), not the recipe's 10 (benchmarks/experiments/g2po_arm.md)
    "G2PO": {"step_advantage_weight": 1.0, "step_return": "g2po", "g2po_success_reward": 1.0},
    # the paper's two other baselines (benchmarks/experiments/baselines_arm.md): RLOO with the recipe's leave-one-out
    # normalisation (the shared mean_std_norm is one the recipe refuses); PPO with a critic as verl-agent's
    # examples/ppo_trainer runs it (gamma = lam = 1 on each turn's tokens), the critic at 10x the policy's rate
    "RLOO": {"estimator": "rloo", "advantage_mode": "leave_one_out"},
    "PPO": {"estimator": "ppo", "gamma": 1.0, "lam": 1.0, "gae_level": "token", "critic_learning_rate": 2.5e-4},
}


# One colour per arm in every figure (the learning curves, the map).
ARM_COLORS = {"GiGPO": "tab:blue", "GRPO": "tab:orange", "HGPO": "tab:green", "GraphGPO": "tab:red",
              "G2PO": "tab:purple", "RLOO": "tab:brown", "PPO": "tab:gray"}


# Fixed before the headline run; never used for a design run (the budget's design run uses DESIGN_SEEDS, the
# warm-up was checked on 1, 2 and 100-103).
HEADLINE_SEEDS = [200, 201, 202, 203, 204, 205, 206, 207, 208, 209]


DESIGN_SEEDS = [100, 101, 102, 103, 104]


# The map (pre-registered in benchmarks/experiments/map.md before any of its runs): fresh seeds,
# never used before (not 0-11, 100-104, 200-209, 300-304, 500-509), the map's design seeds apart from them.
MAP_SEEDS = [600, 601, 602, 603, 604, 605, 606, 607]


MAP_DESIGN_SEEDS = [700, 701, 702, 703, 704]


MAP_EVAL_TASKS = 128


# The pretrained-model runs (--model, benchmarks/learning/llm.py): design (pilot) runs on MAP_DESIGN_SEEDS / 700+;
# the measured seeds, cell, iterations and eval tasks come from the pre-registration
# (benchmarks/experiments/llm_learning.md): until it sets LLM_PREREGISTERED, no --model run reports to
# benchmarks/results/llm_learning/ and --model needs explicit --seeds.
LLM_PREREGISTERED: dict | None = {"seeds": [800, 801, 802, 803, 804, 805], "condition": "h12", "iterations": 8,
                                   "eval_tasks": 64}


# --model settings where the tiny policy's defaults do not fit a LoRA-trained 135M model: LoRA's learning rate
# (the job's CPU examples), completions of "<think>go</think><action>DOOR</action>" + eos (14 SmolLM2 tokens), the
# job's expert warm-up sizes on a CPU (gigpo_trl.job.arguments.WARMUP_CPU_DEFAULTS), held-out episodes generated in
# batches of 32 (a batch of 128 conversation prompts holds ~6 GB of KV cache).
LLM_DEFAULTS = dict(lr=1e-4, max_completion_length=16, warmup_episodes=12, warmup_epochs=2.0, warmup_lr=1e-3,
                    warmup_perturb_rate=0.0, warmup_demos="expert", eval_batch=32)


# The tiny policy's own flags: its model size, its tokenizer's vocabulary and the legal-move warm-up. With --model
# they do not apply (parse_args raises ValueError naming the flag); their defaults fill in only without --model.
TINY_DEFAULTS = dict(hidden=64, layers=2, vocab=600, warmup_balance_steps=200, warmup_balance_tol=0.05,
                     warmup_check=1024, warmup_restart_steps=1500, warmup_legal=0.95, warmup_batch=32,
                     warmup_lr=3e-3)
TINY_ONLY = ("hidden", "layers", "vocab", "warmup_steps", "warmup_max_steps", "warmup_balance_steps",
             "warmup_balance_tol", "warmup_check", "warmup_restart_steps", "warmup_legal", "warmup_batch")
LLM_ONLY = ("warmup_episodes", "warmup_epochs", "warmup_perturb_rate", "warmup_demos")


# One cell of the map per condition: the corridor settings and config fields that differ from the headline
# testbed's (TESTBEDS["corridor"]); ``iterations`` None = not yet set by the condition's design run (the budget
# rule in benchmarks/experiments/map.md), so the condition refuses to run without an explicit --iterations.
# ``axis``/``label``: where the cell sits in the map's figure. ``arms``: GraphGPO matches states exactly (its graph's
# nodes), so it has no similarity-anchor cell.
CONDITIONS = {
    "h6": dict(axis="horizon", label="6 rooms", length=6, max_turns=15, walk_turns=18, iterations=10),
    "h12": dict(axis="horizon", label="12 rooms", length=12, max_turns=30, walk_turns=36, iterations=10),
    "h24": dict(axis="horizon", label="24 rooms", length=24, max_turns=60, walk_turns=72, iterations=10),
    "clock": dict(axis="anchors", label="nuisance,\nexact", nuisance="clock", iterations=10),
    "clock_sim": dict(axis="anchors", label="nuisance,\nsimilarity 0.9", nuisance="clock",
                      anchor_similarity_threshold=0.9, iterations=10,
                      arms=("GiGPO", "GRPO", "HGPO", "G2PO", "RLOO", "PPO")),
    "clock_hook": dict(axis="anchors", label="nuisance,\nanchor_state()", nuisance="clock",
                       anchor_drops_nuisance=True, iterations=10),
    "trap": dict(axis="failure", label="trap door", trap_door=True, iterations=20),
}


# Cells that the figure's axes share: h12 is also "exact anchors" and "diffuse failure".
MAP_AXES = {"horizon": ["h6", "h12", "h24"], "anchors": ["h12", "clock", "clock_sim", "clock_hook"],
            "failure": ["h12", "trap"]}


MAP_AXIS_LABELS = {("anchors", "h12"): "exact\n(no nuisance)", ("failure", "h12"): "diffuse\n(dead ends)"}


# Settings per testbed; any --flag given on the command line overrides them.
TESTBEDS = {
    "corridor": dict(
        # iterations from the design run on DESIGN_SEEDS (GRPO's 5-iteration running mean of training success
        # reached 0.5 at iterations 9, 7, 6, 6 on seeds 100-103: the first multiple of 10 is 10; benchmarks/experiments/learning.md)
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


WARMUP_KEYS = ("testbed", "env", "length", "directions", "nuisance", "trap_door", "map_size", "p", "max_turns",
               "walk_turns", "history_length", "train_tasks", "think", "actions", "hidden", "layers", "vocab", "warmup_steps", "warmup_max_steps",
               "warmup_legal", "warmup_batch", "warmup_lr", "warmup_balance_steps", "warmup_balance_tol",
               "warmup_check", "warmup_restart_steps")


# The warm-up of a --model seed (the package's expert warm-up into a LoRA adapter) depends on these.
LLM_WARMUP_KEYS = ("testbed", "env", "length", "directions", "nuisance", "trap_door", "map_size", "p", "max_turns",
                   "history_length", "history_mode", "train_tasks", "think", "actions", "model",
                   "max_completion_length", "warmup_episodes", "warmup_epochs", "warmup_lr", "warmup_perturb_rate",
                   "warmup_demos")


# The settings a (seed, arm) run's result depends on: runs merged by --report_only must agree on them.
RUN_KEYS = WARMUP_KEYS + ("iterations", "eval_every", "eval_every_early", "groups", "num_generations", "spg", "lr",
                          "gamma", "eval_tasks", "advantage_mode", "max_completion_length", "sampled_eval_temperature",
                          "condition", "anchor_drops_nuisance", "anchor_similarity_threshold", "max_staleness",
                          "model", "history_mode", "warmup_episodes", "warmup_epochs", "warmup_perturb_rate",
                          "warmup_demos", "greedy_evals", "critic_model")


# What a seed's iteration-0 evaluation depends on beside its warm-up (WARMUP_KEYS / LLM_WARMUP_KEYS, the weights,
# the seed): a kept evaluation (--share_start_eval, learning/evaluation.py) is reused only where all of these agree.
START_EVAL_KEYS = ("eval_tasks", "eval_batch", "sampled_eval_temperature", "max_completion_length", "history_mode",
                   "max_turns", "history_length", "think", "actions", "nuisance", "trap_door", "model",
                   "max_staleness")


# Settings added to RUN_KEYS after the first runs (the map's, --model's), at the values that reproduce the runs made
# before them: a run whose run_settings lack them was made with these, so it merges with a new run of the same
# protocol.
MAP_KEY_DEFAULTS = {"nuisance": None, "trap_door": False, "condition": None, "anchor_drops_nuisance": False,
                    "anchor_similarity_threshold": None, "max_staleness": None, "model": None, "history_mode": None,
                    "warmup_episodes": None, "warmup_epochs": None, "warmup_perturb_rate": None,
                    "warmup_demos": None, "greedy_evals": "schedule", "critic_model": None}


def run_settings_filled(settings: dict | None) -> dict | None:
    """``settings`` with every key of ``MAP_KEY_DEFAULTS`` it lacks set to that default (None stays None)."""
    return None if settings is None else MAP_KEY_DEFAULTS | settings


def parse_args(argv=None):
    """The parsed flags, every default filled in. Raises ValueError naming the flag when a tiny-policy flag
    (``TINY_ONLY``) is given with ``--model``, an expert warm-up flag (``LLM_ONLY``) without it, or ``--model`` with
    ``--max_staleness`` or without ``--seeds``, ``--critic_model`` without ``--model``, or ``--share_start_eval``
    with the clock nuisance or ``--max_staleness``; argparse's own errors exit 2."""
    p = argparse.ArgumentParser(description=PACKAGE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--testbed", default="corridor", choices=sorted(TESTBEDS))
    p.add_argument("--model", default=None,
                   help="a pretrained model instead of the tiny policy: 'default' (SmolLM2-135M-Instruct, "
                        "gigpo_trl.models.default_model_path()), a local model folder or a Hub id; its own tokenizer "
                        "and chat template, LoRA as the main job sets it up, the package's expert warm-up "
                        "(learning/llm.py); runs resume from their last checkpoint")
    p.add_argument("--history_mode", choices=["conversation", "window"], default=None,
                   help="GiGPOConfig.history_mode (default: the env's, window)")
    p.add_argument("--eval_batch", type=int, default=None,
                   help="held-out episodes per generation batch (default: all eval tasks; --model: 32)")
    p.add_argument("--warmup_episodes", type=int, default=None,
                   help="--model: expert episodes of the warm-up (gigpo_trl.warmup.expert_warmup; default 12)")
    p.add_argument("--warmup_epochs", type=float, default=None, help="--model: SFT epochs of the warm-up (default 2)")
    p.add_argument("--warmup_perturb_rate", type=float, default=None,
                   help="--model: probability of a random admissible door per warm-up turn (default 0)")
    p.add_argument("--warmup_demos", choices=["expert", "legal"], default=None,
                   help="--model: what the warm-up demonstrates: the expert's door (default; teaches the way) or a "
                        "random legal door of each state (corridor: teaches the rules, not the way, as the tiny "
                        "policy's legal-move warm-up)")
    p.add_argument("--condition", choices=list(CONDITIONS), default=None,
                   help="one cell of the map (CONDITIONS; corridor): its settings, MAP_SEEDS, MAP_EVAL_TASKS eval "
                        "tasks; results to benchmarks/results/map/CONDITION/ for a complete cell")
    p.add_argument("--map_report", action="store_true",
                   help="no training: the map's table and figure from every --map_dir/*/learning.json")
    p.add_argument("--staleness_report", nargs="+", default=None, metavar="RUNS_JSONL",
                   help="no training: learning at each --max_staleness against 0 (learning/staleness.py) from the "
                        "runs.jsonl of --max_staleness runs, one value per file")
    p.add_argument("--staleness_json", default=None,
                   help="--staleness_report: where its json goes (default benchmarks/results/async_learning.json)")
    p.add_argument("--map_dir", default=None, help="--map_report: folder of the cells (default benchmarks/results/map)")
    p.add_argument("--nuisance", choices=["turn", "clock"], default=None,
                   help="corridor: a second observation line that never helps (CorridorEnv's nuisance)")
    p.add_argument("--anchor_drops_nuisance", action="store_true", default=None,
                   help="corridor: anchor_state() drops the nuisance line")
    p.add_argument("--trap_door", action="store_true", default=None,
                   help="corridor: one dead end per task is a trap door that ends the episode with reward 0")
    p.add_argument("--anchor_similarity_threshold", type=float, default=None,
                   help="GiGPOConfig.anchor_similarity_threshold for every arm but GraphGPO (exact states only)")
    p.add_argument("--max_staleness", type=int, default=None,
                   help="generate through a vLLM server stand-in (a transformers copy of the policy in the worker, "
                        "learning/server_standin.py) with GiGPOConfig.max_staleness=K: 0 is the synchronous loop, "
                        "K >= spg collects the next rollout while the trainer optimises; results never go to "
                        "benchmarks/results/map (default: the trainer generates itself, as the map's runs)")
    p.add_argument("--warmup_dir", default=None,
                   help="where the warm-up weights are saved and (--reuse_warmup) found (default --output_dir), so "
                        "cells with the same warm-up settings share them")
    p.add_argument("--quick", action="store_true", help="<= 3-minute smoke version (seed 0 unless --seeds, 3 "
                   "iterations, 16 eval tasks, a short warm-up that may miss its targets)")
    p.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=None,
                   help="arms to run (default: all five, GiGPO GRPO HGPO GraphGPO G2PO); a split run can also add an arm later, merged with "
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
    p.add_argument("--micro_batch_split", choices=["row", "trajectory"], default="row",
                   help="GiGPOConfig.micro_batch_split; default 'row': the recorded headline and map protocols ran "
                        "with TRL's row split, which keeps their results reproducible")
    p.add_argument("--gamma", type=float)
    p.add_argument("--advantage_mode", choices=["mean_norm", "mean_std_norm"])
    p.add_argument("--max_completion_length", type=int)
    p.add_argument("--actions", choices=["doors", "moves"],
                   help="corridor: name the door (DoorCorridor, default) or the direction (CompactCorridor)")
    p.add_argument("--sampled_eval_temperature", type=float, default=1.0)
    p.add_argument("--greedy_evals", choices=["schedule", "start", "none"], default="schedule",
                   help="greedy held-out evaluations besides the sampled ones: 'schedule' (default) at iteration 0 "
                        "and the last 3 evaluations, 'start' at iteration 0 only, 'none' never (the greedy metric "
                        "is then absent from the report)")
    p.add_argument("--share_start_eval", action="store_true",
                   help="make a seed's iteration-0 evaluation once, keep it in the seed's warm-up folder (with the "
                        "random state after it) and reuse it in every arm of the seed made with the same settings "
                        "(learning/evaluation.py); refused with the clock nuisance and --max_staleness")
    p.add_argument("--critic_model", default=None,
                   help="--model, PPO arms: GiGPOConfig.critic_model_name_or_path; 'policy' is the policy's own model "
                        "(a second whole copy, trained in full: the paper's critic); default: a second LoRA adapter "
                        "on the policy's base weights")
    p.add_argument("--workers", type=int, default=2,
                   help="runs in parallel processes (each single-threaded); 1 = one after another")
    p.add_argument("--hidden", type=int, default=None, help="tiny policy: hidden size (64)")
    p.add_argument("--layers", type=int, default=None, help="tiny policy: layers (2)")
    p.add_argument("--vocab", type=int, default=None, help="tiny policy: tokenizer vocabulary (600)")
    p.add_argument("--report_only", action="store_true",
                   help="no training: report the runs already in --runs (default OUTPUT_DIR/runs.jsonl), e.g. of a cut "
                        "run or of a run split across invocations")
    p.add_argument("--runs", nargs="+", default=None, metavar="RUNS_JSONL",
                   help="--report_only: runs.jsonl files to merge (each one's warmups.json is read from its folder)")
    p.add_argument("--recorded", nargs="+", default=None, metavar="LEARNING_JSON",
                   help="--report_only: also the runs of these recorded reports (learning.json of a cell or of the "
                        "headline), paired by seed with the runs of --runs; the arms they lack are checked against "
                        "the recorded GRPO's iteration-0 evaluation and warm-up of the same seed")
    p.add_argument("--warmup_only", action="store_true",
                   help="warm up the seeds (OUTPUT_DIR/seedS/init, warmups.json), print their figures and stop")
    p.add_argument("--reuse_warmup", action="store_true",
                   help="load a seed's warm-up weights from OUTPUT_DIR/seedS/init when a run with the same "
                        "settings left them there")
    p.add_argument("--warmup_steps", type=int, help="warm-up steps at least")
    p.add_argument("--warmup_max_steps", type=int,
                   help="warm-up steps at most, both phases; a seed that needs more fails the run, naming the seed")
    p.add_argument("--warmup_balance_steps", type=int, default=None,
                   help="warm-up phase 2: steps per balance round (learning rate decaying to 0)")
    p.add_argument("--warmup_balance_tol", type=float, default=None,
                   help="passage preference must end within 0.5 +- this on the final sampled check")
    p.add_argument("--warmup_check", type=int, default=None, help="prompts in the warm-up's final sampled check")
    p.add_argument("--warmup_restart_steps", type=int, default=None,
                   help="warm-up phase 1: restart from a fresh init (derived from the seed) when legal play is not "
                        "reached within this many steps of an attempt (0: never)")
    p.add_argument("--warmup_legal", type=float, default=None,
                   help="stop the warm-up once this fraction of sampled moves is legal")
    p.add_argument("--warmup_batch", type=int, default=None)
    p.add_argument("--warmup_lr", type=float, default=None, help="warm-up learning rate (tiny policy 3e-3; --model 1e-3)")
    a = p.parse_args(argv)
    a.seeds_given = a.seeds is not None
    _check_model_flags(a)
    for key, value in (LLM_DEFAULTS if a.model else TINY_DEFAULTS).items():
        if getattr(a, key, None) is None:
            setattr(a, key, value)
    if a.model:  # a resumed --model run reuses its seed's warm-up (the adapter and its figures)
        a.reuse_warmup = True
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
    if a.model:  # the testbed's tiny-policy settings (its legal-move warm-up's steps) do not apply
        for key in TINY_ONLY:
            setattr(a, key, None)
    a.anchor_drops_nuisance = bool(a.anchor_drops_nuisance)
    a.trap_door = bool(a.trap_door)
    if a.anchor_similarity_threshold is not None and not 0.0 < a.anchor_similarity_threshold < 1.0:
        p.error(f"--anchor_similarity_threshold must be in (0, 1), got {a.anchor_similarity_threshold}")
    a.arms = a.arms or list(ARMS)
    a.warmup_fail_soft = a.quick
    if a.quick and a.model:  # a smoke run: seed 0 unless given, 3 iterations, 16 eval tasks, 4 expert episodes
        a.seeds = a.seeds[:1] if a.seeds_given else [0]
        a.iterations = min(a.iterations, 3)
        a.eval_every = a.eval_every_early = 1
        a.eval_tasks = min(a.eval_tasks, 16)
        a.warmup_episodes = min(a.warmup_episodes, 4)
    elif a.quick:  # a smoke run never touches a headline seed
        a.seeds = a.seeds[:1] if a.seeds_given else [0]
        a.iterations = min(a.iterations, 3)
        a.eval_every = a.eval_every_early = 1
        a.eval_tasks = min(a.eval_tasks, 16)
        a.warmup_steps = min(a.warmup_steps, 100)
        a.warmup_balance_steps = min(a.warmup_balance_steps, 50)
        a.warmup_max_steps = min(a.warmup_max_steps, 300 + a.warmup_balance_steps)  # room for one balance round
        a.warmup_check = min(a.warmup_check, 256)
    _check_share_start_eval(a)
    try:
        eval_schedule(a.iterations, a.eval_every, a.eval_every_early)
    except ValueError as e:
        p.error(str(e))
    return a


def _check_model_flags(a) -> None:
    """Raise ValueError naming the flag that does not apply (see ``parse_args``)."""
    if a.model:
        given = [key for key in TINY_ONLY if getattr(a, key) is not None]
        if given:
            raise ValueError(f"--{given[0]} {getattr(a, given[0])} is a flag of the tiny policy (its size, its "
                             f"tokenizer's vocabulary or its legal-move warm-up) and does not apply with --model "
                             f"{a.model}, which brings its own tokenizer and takes the expert warm-up "
                             f"(--warmup_episodes, --warmup_epochs, --warmup_lr, --warmup_perturb_rate)")
        if a.max_staleness is not None:
            raise ValueError(f"--max_staleness {a.max_staleness} is not supported with --model {a.model} (the "
                             "server stand-in serves the tiny policy)")
        if not a.seeds_given and not (a.report_only or a.quick):  # --quick: seed 0
            raise ValueError(f"--model {a.model} needs --seeds: the LLM's measured seeds are set by its "
                             "pre-registration (benchmarks/experiments/llm_learning.md); design runs use 700+")
    elif a.critic_model is not None:
        raise ValueError(f"--critic_model {a.critic_model} applies with --model only (the tiny policy's critic is "
                         "already a whole copy of its decoder)")
    else:
        given = [key for key in LLM_ONLY if getattr(a, key) is not None]
        if given:
            raise ValueError(f"--{given[0]} {getattr(a, given[0])} sets the expert warm-up of --model; the tiny "
                             "policy takes the legal-move warm-up (--warmup_steps, --warmup_legal, ...)")


def _check_share_start_eval(a) -> None:
    """Raise ValueError where a kept iteration-0 evaluation cannot stand for the arm's own: the evaluation also
    advances the clock cells' shared clock, and with ``--max_staleness`` it runs through the server stand-in, whose
    state the kept evaluation does not hold."""
    if not a.share_start_eval:
        return
    if a.nuisance == "clock":
        raise ValueError("--share_start_eval with the clock nuisance: the iteration-0 evaluation advances the run's "
                         "clock, which a kept evaluation does not replay")
    if a.max_staleness is not None:
        raise ValueError(f"--share_start_eval with --max_staleness {a.max_staleness}: the evaluation runs through the "
                         "server stand-in, whose state a kept evaluation does not hold")


def default_results_dir(a, seeds) -> str:
    """benchmarks/results only for a complete headline report (corridor, the 10 HEADLINE_SEEDS, default budget),
    so a partial or quick run never overwrites the committed results; OUTPUT_DIR otherwise."""
    if a.results_dir is not None:
        return a.results_dir
    if getattr(a, "model", None):  # never beside the tiny policy's results
        pre = LLM_PREREGISTERED
        measured = (pre is not None and not a.quick and sorted(seeds) == sorted(pre["seeds"])
                    and a.condition == pre["condition"] and a.iterations == pre["iterations"]
                    and a.eval_tasks == pre["eval_tasks"])
        return str(RESULTS / "llm_learning" / (a.condition or a.testbed)) if measured else a.output_dir
    if a.condition is not None:
        cell = (a.max_staleness is None and not a.quick and sorted(seeds) == sorted(MAP_SEEDS)
                and a.iterations == CONDITIONS[a.condition]["iterations"] and a.eval_tasks == MAP_EVAL_TASKS)
        root = str(RESULTS / "map" / a.condition)
        return root if cell else a.output_dir
    headline = (not a.quick and a.testbed == "corridor" and sorted(seeds) == sorted(HEADLINE_SEEDS)
                and a.iterations == TESTBEDS["corridor"]["iterations"])
    return str(RESULTS) if headline else a.output_dir
