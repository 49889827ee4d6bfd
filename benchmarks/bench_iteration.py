"""Seconds per GiGPO iteration and rows per iteration in the tiny-model test setup (tests/test_trainer.py).

    python benchmarks/bench_iteration.py            # 5 iterations after one warm-up iteration
    python benchmarks/bench_iteration.py --iterations 10

Setup: the tests' tiny random Qwen2 (hidden 32, 2 layers) and offline BPE tokenizer, NoisyLineWalkEnv (corridor
lengths 3-6), 2 task groups x 4 rollouts per iteration, max_turns 4, max_completion_length 12, CPU, one thread.
Prints per-iteration wall seconds (TRL's step_time), rollout seconds, advantage seconds and rows, then the means.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    return parser


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer before the heavy imports

from conftest import CORPUS  # noqa: E402
from toy_env import NoisyLineWalkEnv  # noqa: E402

from gigpo_trl import GiGPOConfig, GiGPOTrainer  # noqa: E402
from tiny_models import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from results_io import is_default_run, write_result  # noqa: E402


def main() -> None:
    cli = build_parser().parse_args()
    tokenizer = build_tiny_tokenizer(CORPUS, vocab_size=300)
    model = build_tiny_model(tokenizer)
    with tempfile.TemporaryDirectory() as out:
        args = GiGPOConfig(
            output_dir=out, num_generations=4, per_device_train_batch_size=4, steps_per_generation=2,
            max_steps=cli.iterations + 1, max_turns=4, max_completion_length=12, bf16=False,
            gradient_checkpointing=False, learning_rate=5e-2, report_to="none", save_strategy="no",
            logging_steps=1, use_cpu=True, seed=0, disable_tqdm=True, gradient_accumulation_steps=2,
        )
        trainer = GiGPOTrainer(model, env=NoisyLineWalkEnv, args=args, processing_class=tokenizer)
        trainer.train()
    logs = [e for e in trainer.state.log_history if "rollout/rows" in e][1:]  # drop the warm-up iteration
    print(f"{'iter':>4} {'wall s':>8} {'rollout s':>10} {'adv ms':>8} {'rows':>5} {'gen calls':>9}")
    for i, e in enumerate(logs, 1):
        print(f"{i:>4} {e['step_time']:>8.3f} {e['rollout/seconds']:>10.3f} {1000 * e['rollout/advantage_seconds']:>8.2f}"
              f" {int(e['rollout/rows']):>5} {int(e['rollout/generate_calls']):>9}")
    mean = lambda key: sum(e[key] for e in logs) / len(logs)  # noqa: E731
    print(f"mean: {mean('step_time'):.3f} s per iteration, {mean('rollout/rows'):.1f} rows per iteration "
          f"(8 trajectories x <= 4 turns), rollout {mean('rollout/seconds'):.3f} s, "
          f"advantages {1000 * mean('rollout/advantage_seconds'):.2f} ms")
    write_result("bench_iteration", {
        "seconds_per_iteration": round(mean("step_time"), 3), "rows_per_iteration": round(mean("rollout/rows"), 1),
        "rollout_s": round(mean("rollout/seconds"), 3), "advantage_ms": round(1000 * mean("rollout/advantage_seconds"), 2),
    }, recorded=is_default_run(build_parser(), cli))


if __name__ == "__main__":
    main()
