"""Seconds per iteration with asynchronous rollouts (max_staleness=1) vs the synchronous loop (max_staleness=0), with
episodes in lockstep and stepped on their own (episode_stepping="independent").

    python benchmarks/bench_async_rollouts.py                 # both scenarios, both steppings, 4 timed iterations
    python benchmarks/bench_async_rollouts.py --iterations 2  # shorter (writes outputs/bench/results/)
    python benchmarks/bench_async_rollouts.py --episode_stepping independent  # one stepping only (idem)

What it measures: the overlap of the rollout producer with the trainer's optimisation, not vLLM. The server is the
tests' recording fake of TRL's vLLM client (tests/fake_vllm.py; its answers depend on the prompt only) that takes
``--generate_latency`` seconds per request, standing in for a server on other devices; the trainer is a random
Qwen2 (hidden 128, 2 layers) on this machine's CPU, one thread. The fake's log-probs are far from the random
model's, so the importance weights are ~0: the timing is measured, not learning. Two scenarios, 2 task groups x 2 episodes of 8 turns
each (every episode lives all 8 turns): ``generate`` (each request takes the latency, environment steps are
instant) and ``slow_env`` (a short latency, every environment step takes a random 0.2-1.0 s, 4 env worker
processes). Each scenario runs max_staleness 0 and 1 with each ``--episode_stepping``; every ratio is against the
synchronous lockstep loop (``ratio_sync_independent``: the synchronous loop with independent episodes). Each
iteration's wall time is TRL's ``step_time``; the first iteration (the producer's start) is left out.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=4, help="timed iterations per run (after one more)")
    parser.add_argument("--generate_latency", type=float, default=0.25, help="seconds per request, 'generate'")
    parser.add_argument("--slow_env_latency", type=float, default=0.05, help="seconds per request, 'slow_env'")
    parser.add_argument("--scenarios", nargs="+", default=["generate", "slow_env"], choices=["generate", "slow_env"])
    parser.add_argument("--episode_stepping", nargs="+", default=["lockstep", "independent"],
                        choices=["lockstep", "independent"], help="the steppings to run (each with max_staleness 0, 1)")
    return parser


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer before the heavy imports

import contextlib  # noqa: E402
import functools  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from unittest import mock  # noqa: E402

import datasets  # noqa: E402
from conftest import CORPUS  # noqa: E402
from fake_vllm import RecordingVLLMClient, SyncingVLLMClient  # noqa: E402
from tiny_models import build_tiny_model, build_tiny_tokenizer  # noqa: E402
from toy_env import FixedLengthEnv, SlowStepEnv  # noqa: E402

from gigpo_trl import GiGPOConfig, GiGPOTrainer  # noqa: E402
from results_io import is_default_run, write_result  # noqa: E402

TURNS = 8


def run(tokenizer, scenario: str, max_staleness: int, stepping: str, cli) -> list[float]:
    """TRL's ``step_time`` of each timed iteration of one run."""
    latency = cli.generate_latency if scenario == "generate" else cli.slow_env_latency

    class SlowServer(SyncingVLLMClient):
        events: list = []

        def _post(self, url, json=None, **kwargs):
            time.sleep(latency)
            return super()._post(url, json=json, **kwargs)

    env = FixedLengthEnv if scenario == "generate" else functools.partial(SlowStepEnv, delay=(0.2, 1.0))
    tasks = datasets.Dataset.from_dict({"task": [TURNS] * 64, "seed": list(range(64))})
    RecordingVLLMClient.tokenizer = tokenizer
    able = contextlib.nullcontext(SimpleNamespace(available=True, message=None))
    with tempfile.TemporaryDirectory() as out:
        args = GiGPOConfig(
            output_dir=out, use_vllm=True, vllm_mode="server", vllm_server_base_url="http://fake:8000",
            max_staleness=max_staleness, episode_stepping=stepping, num_generations=2, per_device_train_batch_size=4, steps_per_generation=1,
            max_steps=cli.iterations + 1, max_turns=TURNS, max_completion_length=24, history_length=2, bf16=False,
            gradient_checkpointing=False, learning_rate=1e-3, report_to="none", save_strategy="no", logging_steps=1,
            use_cpu=True, seed=0, disable_tqdm=True, num_env_workers=0 if scenario == "generate" else 4)
        with mock.patch("trl.generation.vllm_generation.is_vllm_available", return_value=True), \
             mock.patch("trl.generation.vllm_generation.VLLMClient", SlowServer), \
             mock.patch("gigpo_trl.trainer.server_weight_sync_guard", lambda args: able):
            trainer = GiGPOTrainer(build_tiny_model(tokenizer, hidden_size=128, num_layers=2), env=env, args=args,
                                   processing_class=tokenizer, train_dataset=tasks)
        trainer.train()
    return [e["step_time"] for e in trainer.state.log_history if "step_time" in e][1:]


def main() -> None:
    cli = build_parser().parse_args()
    tokenizer = build_tiny_tokenizer(CORPUS, vocab_size=300)
    figures = {}
    for scenario in cli.scenarios:
        times = {(k, stepping): run(tokenizer, scenario, k, stepping, cli) for stepping in cli.episode_stepping
                 for k in (0, 1)}
        mean = {key: sum(v) / len(v) for key, v in times.items()}
        base = mean.get((0, "lockstep"))
        figures[scenario] = {}
        for (k, stepping), value in mean.items():
            suffix = "" if stepping == "lockstep" else "_independent"
            figures[scenario][f"s_per_iteration_{'async' if k else 'sync'}{suffix}"] = round(value, 3)
            if base is not None and (k, stepping) != (0, "lockstep"):
                figures[scenario][f"ratio{suffix}" if k else f"ratio_sync{suffix}"] = round(value / base, 3)
            print(f"{scenario}: max_staleness={k}, {stepping}: {value:.2f} s/iteration"
                  + ("" if base is None else f", {value / base:.2f}x the synchronous lockstep loop")
                  + f"  (per iteration: {[round(t, 2) for t in times[(k, stepping)]]})")
    write_result("bench_async_rollouts", figures, recorded=is_default_run(build_parser(), cli))


if __name__ == "__main__":
    main()
