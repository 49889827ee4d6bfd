"""README's report screenshot, regenerated from a main-job run, and the record of which run it shows.

    python scripts/report_screenshot.py outputs/gigpo-webshop    # the main job's --output_dir
    python scripts/report_screenshot.py --check                  # exit 1 naming each disagreement

The first form opens the run's ``report.html`` in headless Chromium (Debian's ``chromium``), saves the top of the
page as ``docs/images/report_main_job.png`` and writes ``docs/images/report_main_job.json`` beside it: the run (its
folder, when it finished, the code's commit when the folder is inside a git checkout), its success rate and task
score per evaluation (from its ``eval_results.json``), when the image was taken and the image's SHA-256.

``--check`` (also run by ``tests/test_benchmarks.py``) fails when the record is not the shipped image's (another
hash), the image was taken before the run it claims finished, or README's quoted main-job figures (success
``0.000 before, 0.167 after the warm-up, 0.200 after one GiGPO iteration``, task score ``a → b → c``) or
``benchmarks/results/main_job.json``'s differ from the record's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGE = REPO / "docs" / "images" / "report_main_job.png"
RECORD = IMAGE.with_suffix(".json")
RESULTS = REPO / "benchmarks" / "results" / "main_job.json"
PHASES = ("before", "after_warmup", "after")  # eval_results.json's names of the three evaluations
# README's sentence on the main job: "0.000 before, **0.167 after the warm-up** (...) and 0.200 after one GiGPO
# iteration (...); task score 0.000 → 0.705 → 0.717"
README_SUCCESS = re.compile(r"(\d\.\d{3}) before, \*\*(\d\.\d{3}) after the warm-up\*\*.*?(\d\.\d{3}) after one GiGPO")
README_SCORE = re.compile(r"task score (\d\.\d{3}) → (\d\.\d{3}) → (\d\.\d{3})")


def run_figures(eval_results: dict) -> dict:
    """``{"success": {phase: rate}, "task_score": {phase: score}, "eval_goals": n}`` of a run's eval_results.json,
    rounded to 3 decimals as README quotes them.

    Raises:
        KeyError: an evaluation phase or its figure is missing (names it): not a main-job run with a warm-up.
    """
    out: dict = {"success": {}, "task_score": {}}
    for phase in PHASES:
        if phase not in eval_results:
            raise KeyError(f"eval_results.json has no {phase!r} evaluation (found {sorted(eval_results)}); the "
                           f"screenshot is of a main-job run with its warm-up")
        out["success"][phase] = round(float(eval_results[phase]["success_rate"]), 3)
        out["task_score"][phase] = round(float(eval_results[phase]["task_score"]), 3)
    out["eval_goals"] = int(eval_results["after"]["num_tasks"])
    return out


def readme_figures(readme: str) -> dict | None:
    """The main-job figures README quotes, as :func:`run_figures` gives them (without ``eval_goals``), or None when
    the sentence is not found."""
    text = " ".join(readme.split())  # the sentence may wrap anywhere
    success, score = README_SUCCESS.search(text), README_SCORE.search(text)
    if not success or not score:
        return None
    return {"success": dict(zip(PHASES, map(float, success.groups()))),
            "task_score": dict(zip(PHASES, map(float, score.groups())))}


def results_figures(results: dict) -> dict:
    """``benchmarks/results/main_job.json``'s figures in :func:`run_figures`'s form (without ``eval_goals``)."""
    names = {"before": "before", "after_warmup": "after_warmup", "after": "after_gigpo"}
    f = results["figures"]
    return {key: {phase: round(float(f[key][names[phase]]), 3) for phase in PHASES} for key in ("success", "task_score")}


def check(record: dict, image: bytes, readme: str, results: dict) -> list[str]:
    """The disagreements between the image's record, the image, README and the results file (empty: none)."""
    problems = []
    digest = hashlib.sha256(image).hexdigest()
    if record.get("sha256") != digest:
        problems.append(f"{RECORD.name} describes another image (sha256 {record.get('sha256')}, the shipped image's "
                        f"is {digest}): regenerate both with scripts/report_screenshot.py RUN_DIR")
    taken, finished = dt.datetime.fromisoformat(record["taken"]), dt.datetime.fromisoformat(record["run"]["finished"])
    if taken < finished:
        problems.append(f"the image was taken at {record['taken']}, before the run it claims finished "
                        f"({record['run']['finished']})")
    shown = {key: record["figures"][key] for key in ("success", "task_score")}
    quoted = readme_figures(readme)
    if quoted is None:
        problems.append("README.md no longer quotes the main job's figures as 'X before, **Y after the warm-up** ... "
                        "Z after one GiGPO ...; task score A → B → C'; update scripts/report_screenshot.py")
    elif quoted != shown:
        problems.append(f"README.md quotes {quoted}, the image's run has {shown}")
    measured = results_figures(results)
    if measured != shown:
        problems.append(f"{RESULTS.relative_to(REPO)} has {measured}, the image's run has {shown}")
    return problems


def git_checkout(folder: Path) -> tuple[str | None, str]:
    """``(short commit, folder relative to the checkout)`` of the git checkout holding ``folder`` (the code the run
    ran), or ``(None, folder's name)`` outside one."""
    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True)
        return (done.stdout.strip() or None) if done.returncode == 0 else None

    commit, top = git("rev-parse", "--short", "HEAD"), git("rev-parse", "--show-toplevel")
    if commit is None or top is None:
        return None, folder.name
    return commit, folder.resolve().relative_to(Path(top).resolve()).as_posix()


def screenshot(report: Path, out: Path, width: int, height: int) -> str:
    """Save the top ``width`` × ``height`` pixels of ``report`` as rendered by headless Chromium; returns Chromium's
    version line.

    Raises:
        FileNotFoundError: no ``chromium`` on PATH (Debian: ``apt-get install chromium``).
        RuntimeError: Chromium wrote no image (its stderr's end in the message).
    """
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise FileNotFoundError("headless Chromium not found: install Debian's `chromium` package")
    version = subprocess.run([browser, "--version"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as profile:
        tmp = Path(profile) / "shot.png"
        done = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--hide-scrollbars", f"--user-data-dir={profile}/user", f"--window-size={width},{height}",
             "--virtual-time-budget=20000", f"--screenshot={tmp}", report.resolve().as_uri()],
            capture_output=True, text=True, timeout=600)
        if not tmp.is_file():
            raise RuntimeError(f"chromium wrote no screenshot (exit {done.returncode}): {done.stderr[-1000:]}")
        out.write_bytes(tmp.read_bytes())
    return version


def regenerate(run_dir: Path, width: int, height: int) -> dict:
    """Screenshot ``run_dir``'s report into :data:`IMAGE` and write :data:`RECORD`; returns the record."""
    report, evals = run_dir / "report.html", run_dir / "eval_results.json"
    for path in (report, evals):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: RUN_DIR is the main job's --output_dir after a run with "
                                    f"rollout records (examples/train_webshop.py writes both)")
    figures = run_figures(json.loads(evals.read_text()))
    finished = dt.datetime.fromtimestamp(evals.stat().st_mtime, dt.timezone.utc)
    version = screenshot(report, IMAGE, width, height)
    commit, folder = git_checkout(run_dir)
    record = {
        "image": str(IMAGE.relative_to(REPO)),
        "sha256": hashlib.sha256(IMAGE.read_bytes()).hexdigest(),
        "taken": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "browser": version,
        "run": {"folder": folder, "report": "report.html", "results": "eval_results.json",
                "finished": finished.isoformat(timespec="seconds"), "commit": commit,
                "command": "examples/train_webshop.py (README's main job)"},
        "figures": figures,
    }
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report_screenshot.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", type=Path,
                        help="the main job's --output_dir (report.html and eval_results.json)")
    parser.add_argument("--check", action="store_true", help="check the shipped image's record; write nothing")
    parser.add_argument("--width", type=int, default=1400, help="image width in pixels (default 1400)")
    parser.add_argument("--height", type=int, default=2000, help="image height in pixels (default 2000)")
    args = parser.parse_args(argv)
    if args.check == (args.run_dir is not None):
        parser.error("give either RUN_DIR (regenerate) or --check")
    if args.run_dir is not None:
        record = regenerate(args.run_dir, args.width, args.height)
        print(f"{record['image']} and {RECORD.relative_to(REPO)} written from {args.run_dir} "
              f"(success {record['figures']['success']})")
    problems = check(json.loads(RECORD.read_text()), IMAGE.read_bytes(), (REPO / "README.md").read_text(),
                     json.loads(RESULTS.read_text()))
    for problem in problems:
        print(f"[report_screenshot] {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
