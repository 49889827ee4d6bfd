"""A (seed, arm) run's files as it goes, and where a rerun resumes it.

In the run's folder (``OUTPUT_DIR/seedS/ARM``, the trainer's output_dir):

- ``run_settings.json``: the run's ``RUN_KEYS`` settings; a rerun with other settings is refused.
- ``evals.jsonl``: one line per held-out evaluation (iteration 0 first), written as it is made.
- ``progress.jsonl``: one line per finished iteration: cumulative wall and CPU seconds (evaluations included),
  the evaluations' own, this process's peak resident memory (MB), the load average, and the step-group sizes of
  that iteration's rollout.
- ``checkpoint-N`` (runs with checkpoints, ``--model``): the trainer's checkpoint after each iteration (the last
  one kept); a rerun resumes from it with the evaluations and progress lines up to its iteration.
"""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

from .settings import run_settings_filled

EVALS = "evals.jsonl"
PROGRESS = "progress.jsonl"
SETTINGS = "run_settings.json"


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MB (``ru_maxrss``: KB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def append(run_dir, name: str, record: dict) -> None:
    with (Path(run_dir) / name).open("a") as f:
        f.write(json.dumps(record, default=float) + "\n")


def checkpoint_iteration(run_dir, spg: int) -> tuple[str | None, int]:
    """``(the last checkpoint's path, its iteration)`` in ``run_dir``, or ``(None, 0)``. Raises ValueError when its
    step is not a whole iteration (``spg`` optimizer steps each)."""
    from transformers.trainer_utils import get_last_checkpoint

    run_dir = Path(run_dir)
    last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
    if last is None:
        return None, 0
    step = json.loads((Path(last) / "trainer_state.json").read_text())["global_step"]
    if step % spg:
        raise ValueError(f"checkpoint {last} is at optimizer step {step}, not a whole iteration of {spg} steps")
    return last, step // spg


def start(run_dir, settings: dict, spg: int, resume: bool) -> tuple[str | None, list[dict], list[dict]]:
    """Open the run's folder. ``resume``: from the last checkpoint, keeping the evaluations and progress lines up to
    its iteration (the files are rewritten without the later ones); otherwise, or with no checkpoint, fresh (both
    files emptied). Returns ``(checkpoint or None, kept evaluations, kept progress lines)``.

    Raises:
        ValueError: ``run_settings.json`` holds other settings than ``settings`` while a checkpoint is there.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint, iteration = checkpoint_iteration(run_dir, spg) if resume else (None, 0)
    saved = run_dir / SETTINGS
    if checkpoint is not None and saved.exists():
        # a key added to RUN_KEYS later stands at the value the older runs were made with (MAP_KEY_DEFAULTS)
        old = run_settings_filled(json.loads(saved.read_text()))
        settings_filled = run_settings_filled(json.loads(json.dumps(settings, default=float)))
        if old != settings_filled:
            diff = sorted(k for k in set(old) | set(settings_filled) if old.get(k) != settings_filled.get(k))
            raise ValueError(f"{run_dir} holds a run made with other settings ({', '.join(diff)}); not resuming it: "
                             "give another --output_dir or remove that folder")
    saved.write_text(json.dumps(settings, default=float))
    evals = [e for e in _read(run_dir / EVALS) if e["iteration"] <= iteration] if checkpoint else []
    progress = [p for p in _read(run_dir / PROGRESS) if p["iteration"] <= iteration] if checkpoint else []
    if checkpoint and (not evals or evals[0]["iteration"] != 0 or len(progress) != iteration):
        checkpoint, evals, progress = None, [], []  # the files do not cover the checkpoint: start afresh
    for name, kept in ((EVALS, evals), (PROGRESS, progress)):
        (run_dir / name).write_text("".join(json.dumps(r, default=float) + "\n" for r in kept))
    return checkpoint, evals, progress


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
