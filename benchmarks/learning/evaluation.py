"""The learning benchmark's held-out evaluations: which iterations are also evaluated greedily (``--greedy_evals``),
a run's evaluations (``evaluate_both``, ``PeriodicEval``), and a seed's iteration-0 evaluation kept in its warm-up
folder for every arm of the seed (``--share_start_eval``, ``KeptStartEval``).

Sharing the iteration-0 evaluation is sound only because every arm of a seed starts from the same weights with the
same random state when it evaluates (the trainer seeds torch's generator from the run's seed; PPO's critic is built
without drawing from it): the kept evaluation then is the one the arm would have made. The random state after it
(python, numpy, torch) is kept too and restored, so an arm that reuses it trains exactly as one that evaluated itself
(tests/test_learning_evals.py checks both on the tiny model).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
from results_io import cpu_model

from . import progress
from .settings import LLM_WARMUP_KEYS, START_EVAL_KEYS, WARMUP_KEYS


def greedy_iterations(mode: str, schedule) -> list[int]:
    """The iterations evaluated greedily besides sampled (``--greedy_evals``): ``"schedule"`` iteration 0 and the
    last 3 of ``schedule`` (the headline points), ``"start"`` 0 only, ``"none"`` none. Raises ValueError on another
    mode."""
    if mode == "schedule":
        return [0] + list(schedule[-3:])
    if mode == "start":
        return [0]
    if mode == "none":
        return []
    raise ValueError(f"greedy_evals must be 'schedule', 'start' or 'none', got {mode!r}")


def rng_state() -> dict:
    """The random state of python's, numpy's and torch's (CPU) global generators."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def weights_digest(init_dir) -> str:
    """sha256 over the ``*.safetensors`` files of ``init_dir`` (the warm-up weights or adapter), in name order."""
    h = hashlib.sha256()
    for path in sorted(Path(init_dir).glob("*.safetensors")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class KeptStartEval:
    """A seed's iteration-0 evaluation kept in its warm-up folder ``init_dir`` (``--share_start_eval``):
    ``start_eval_<digest>.json`` (the key and the point) and ``.rng.pt`` (the random state right after it), the
    digest that of ``key``: the warm-up's settings (``WARMUP_KEYS`` or ``LLM_WARMUP_KEYS``), ``START_EVAL_KEYS``,
    the seed, whether greedy is evaluated at iteration 0, the warm-up weights' digest and the CPU model. A file made
    with other settings has another name, and ``load`` checks the key it holds too."""

    def __init__(self, a, seed: int, init_dir, greedy: bool):
        warm = LLM_WARMUP_KEYS if a.model else WARMUP_KEYS
        self.key = json.loads(json.dumps(
            {k: getattr(a, k, None) for k in warm + START_EVAL_KEYS}
            | {"seed": seed, "greedy_at_start": bool(greedy), "weights_sha256": weights_digest(init_dir),
               "cpu_model": cpu_model()}, default=str))
        digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:16]
        self.path = Path(init_dir) / f"start_eval_{digest}.json"
        self.rng_path = self.path.with_suffix(".rng.pt")

    def load(self) -> dict | None:
        """The kept point with the random state after it restored, or None (none kept, or made with another key)."""
        if not (self.path.exists() and self.rng_path.exists()):
            return None
        kept = json.loads(self.path.read_text())
        if kept.get("key") != self.key:
            return None
        set_rng_state(torch.load(self.rng_path, weights_only=False))
        return kept["point"]

    def save(self, point: dict) -> None:
        """Keep ``point`` and the random state now (right after the evaluation). Written to temporary files and
        renamed, the state first, so a reader never sees half a file (two arms of a seed may keep the same one)."""
        tmp = f".{os.getpid()}.tmp"
        torch.save(rng_state(), str(self.rng_path) + tmp)
        os.replace(str(self.rng_path) + tmp, self.rng_path)
        Path(str(self.path) + tmp).write_text(json.dumps({"key": self.key, "point": point}, default=float))
        os.replace(str(self.path) + tmp, self.path)


class PeriodicEval:
    """TrainerCallback: held-out evaluation at the iterations of ``eval_iterations`` (sampled at T = 1; greedy too at
    those in ``greedy_iterations``), each written to the run's ``evals.jsonl`` as it is made, and after every
    iteration a line of ``progress.jsonl`` (learning/progress.py). ``kept_evals`` / ``kept_progress``: what a resumed
    run had before its checkpoint (the clocks continue from its last line)."""

    def __init__(self, eval_iterations, greedy_iterations, spg, sampled_temperature, run_dir, groups,
                 kept_evals=(), kept_progress=()):
        from transformers import TrainerCallback

        outer = self

        class _CB(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                it, rest = divmod(state.global_step, spg)
                if rest == 0 and outer.trainer is not None:
                    if it in outer.eval_iterations:
                        # the evaluation's own log resets the shared control's should_log: keep this step's
                        # (with steps_per_generation 1 the rollout's metrics were otherwise never logged)
                        should_log = control.should_log
                        outer.evaluate(it)
                        control.should_log = should_log
                    outer.iteration_done(it)
                return control

        self.callback = _CB()
        self.sampled_temperature = sampled_temperature
        self.eval_iterations = set(eval_iterations)
        self.greedy_iterations = set(greedy_iterations)
        self.run_dir, self.groups = run_dir, groups
        self.trainer = None
        self.points: list[dict] = [e for e in kept_evals if e["iteration"] > 0]
        last = kept_progress[-1] if kept_progress else {}
        self.base_wall, self.base_cpu = last.get("wall_seconds", 0.0), last.get("cpu_seconds", 0.0)
        self.eval_seconds = last.get("eval_seconds", 0.0)
        self.eval_cpu_seconds = last.get("eval_cpu_seconds", 0.0)  # single-threaded: ~ the wall time on an idle core
        self.written_groups = len(groups.iterations)
        self.label = ""
        self.start_source = "resumed"  # start() sets "own" or "kept"
        self.t_start, self.c_start = time.perf_counter(), time.process_time()

    def evaluate(self, it: int, greedy: bool | None = None) -> dict:
        """Evaluate now as iteration ``it``: the point, also appended to evals.jsonl."""
        t0, c0 = time.perf_counter(), time.process_time()
        greedy = it in self.greedy_iterations if greedy is None else greedy
        point = evaluate_both(self.trainer, self.sampled_temperature, greedy=greedy) | {"iteration": it}
        self.eval_seconds += time.perf_counter() - t0
        self.eval_cpu_seconds += time.process_time() - c0
        progress.append(self.run_dir, progress.EVALS, point)
        if it > 0:
            self.points.append(point)
        g = f"{point['greedy']:.2f}" if "greedy" in point else "-"
        print(f"    {self.label} it {it}: sampled {point['sampled']:.2f} greedy {g} "
              f"({time.perf_counter() - self.t_start:.0f}s)", flush=True)
        return point

    def start(self, kept: KeptStartEval | None = None) -> dict:
        """The iteration-0 evaluation: ``kept``'s (the random state after it restored, the point appended to
        evals.jsonl) where it holds one, otherwise made now (greedy too where 0 is in ``greedy_iterations``) and,
        with ``kept``, kept for the seed's other arms. Sets ``start_source`` ("own" or "kept")."""
        point = kept.load() if kept is not None else None
        if point is None:
            point = self.evaluate(0)
            if kept is not None:
                kept.save(point)
            self.start_source = "own"
            return point
        progress.append(self.run_dir, progress.EVALS, point)
        self.start_source = "kept"
        print(f"    {self.label} it 0: kept evaluation {kept.path.name} (sampled {point['sampled']:.2f})", flush=True)
        return point

    def totals(self) -> tuple[float, float]:
        """(wall, CPU) seconds of the run so far, evaluations included, over every session of a resumed run."""
        return (self.base_wall + time.perf_counter() - self.t_start,
                self.base_cpu + time.process_time() - self.c_start)

    def iteration_done(self, it: int) -> None:
        wall, cpu = self.totals()
        new = self.groups.iterations[self.written_groups:]
        deep = self.groups.deepest[self.written_groups:] if len(self.groups.deepest) == len(self.groups.iterations) \
            else []
        self.written_groups = len(self.groups.iterations)
        progress.append(self.run_dir, progress.PROGRESS, {
            "iteration": it, "wall_seconds": wall, "cpu_seconds": cpu, "eval_seconds": self.eval_seconds,
            "eval_cpu_seconds": self.eval_cpu_seconds, "peak_rss_mb": progress.peak_rss_mb(),
            "load": progress.load_average(), "group_sizes": [x.tolist() for x in new],
            "deepest": [x.tolist() for x in deep]})


def evaluate_both(trainer, temperature: float, greedy: bool = True) -> dict:
    """Held-out success sampled at ``temperature`` and (``greedy``) greedily (eval_temperature = 0), on the same
    tasks, in batches of ``per_device_eval_batch_size`` (default: the eval tasks). The model's train/eval mode is
    restored after: TRL files the metrics it logs under the mode the model is in, so a training step's log right
    after an evaluation would go to "eval"."""
    saved, was_training = trainer.args.eval_temperature, trainer.model.training
    try:
        trainer.args.eval_temperature = temperature
        m = trainer.evaluate(metric_key_prefix="eval_sampled")
        sampled = {"sampled": m["eval_sampled_success_rate"], "sampled_length": m.get("eval_sampled_length_mean"),
                   "sampled_invalid": m.get("eval_sampled_invalid_action_rate")}
        if not greedy:
            return sampled
        trainer.args.eval_temperature = 0.0
        m = trainer.evaluate()
        return sampled | {"greedy": m["eval_success_rate"], "greedy_length": m.get("eval_length_mean"),
                          "greedy_invalid": m.get("eval_invalid_action_rate")}
    finally:
        trainer.args.eval_temperature = saved
        trainer.model.train(was_training)
