"""Where a benchmark's figures go: ``benchmarks/results/NAME.json``, with the command, commit, date and machine that
produced them. ``scripts/gen_results.py`` builds the results pages and README's headline table from these files.

A run at the script's default settings writes ``benchmarks/results/``; any other run (``--quick``, other sizes)
writes ``outputs/bench/results/`` so it never replaces a recorded figure by accident.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
SCRATCH = REPO / "outputs" / "bench" / "results"
PROVENANCE = ("command", "commit", "date", "machine")


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed from the repository root: ``python benchmarks/x.py --flag value``."""
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    try:
        script = script.relative_to(REPO)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *argv[1:]])


def commit() -> str:
    """The repository's short commit, with ``+changes`` when the tree has uncommitted changes; ``unknown`` outside git."""
    root = REPO
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor or machine string. Runs on another CPU
    model are not bit-for-bit the same (other float kernels): the learning benchmark records it with every run."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """CPU model, cores, memory and load average of this machine, in one line."""
    model = cpu_model()
    try:
        mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal"))
        memory = f", {mem_kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        memory = ""
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return f"{model}, {os.cpu_count()} cores{memory}{load}, {platform.system()}"


def provenance(argv: list[str] | None = None) -> dict:
    return {"command": command_line(argv), "commit": commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "machine": machine()}


def is_default_run(parser, args) -> bool:
    """Whether ``args`` (parsed by ``parser``) are the script's defaults, i.e. a run whose figures are the record."""
    return vars(args) == vars(parser.parse_args([]))


def _merge(old: dict, new: dict) -> dict:
    out = dict(old)
    for key, value in new.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_result(name: str, figures: dict, *, recorded: bool, folder: str | Path | None = None,
                 merge: bool = False) -> Path:
    """Write ``{"benchmark": name, command, commit, date, machine, "figures": figures}`` to ``benchmarks/results/``
    when ``recorded`` (a run at the recorded settings), else to ``folder`` (default ``outputs/bench/results/``).
    ``merge``: keep the file's other figures (a script that measures one setting per run, e.g. one episode length);
    the provenance is then this run's. Returns the path written."""
    out = RESULTS if recorded else Path(folder or SCRATCH)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    if merge and path.exists():
        figures = _merge(json.loads(path.read_text()).get("figures", {}), figures)
    path.write_text(json.dumps({"benchmark": name, **provenance(), "figures": figures}, indent=1, default=float)
                    + "\n")
    print(f"figures: {path}")
    return path


def load_result(name: str, folder: str | Path | None = None) -> dict:
    """``benchmarks/results/NAME.json`` (``NAME`` may hold a sub-folder, e.g. ``map/map``)."""
    return json.loads((Path(folder or RESULTS) / f"{name}.json").read_text())
