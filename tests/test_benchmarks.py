"""The scripts of benchmarks/ and scripts/ cannot rot unseen: each answers ``--help`` (so it still imports and its
command line still builds), without importing torch, transformers or TRL first (so ``--help`` and a bad flag answer
at once); the shell scripts answer ``--help`` too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(str(p.relative_to(REPO)) for folder in ("benchmarks", "scripts") for p in (REPO / folder).glob("*.py"))
SHELL_SCRIPTS = sorted(str(p.relative_to(REPO)) for p in (REPO / "scripts").glob("*.sh"))
HEAVY = {"torch", "transformers", "trl", "datasets", "peft", "vllm", "accelerate"}
# Scripts whose parser is built from a heavy package, and why.
HEAVY_BEFORE_ARGPARSE = {
    "benchmarks/learning.py": "its arms are checked against GiGPOConfig's fields",
    "scripts/vllm_serve_cpu.py": "its parser is TRL's own vllm-serve parser (trl's top-level import is lazy)",
}


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _imported(importtime_log: str) -> set[str]:
    """Top-level module names from ``python -X importtime``'s log (``import time: self | cumulative | name``)."""
    names = set()
    for line in importtime_log.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize("script", SCRIPTS + SHELL_SCRIPTS)
def test_every_script_answers_help_before_heavy_imports(script):
    command = ["bash", script] if script.endswith(".sh") else [sys.executable, "-X", "importtime", script]
    done = subprocess.run([*command, "--help"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{script} --help exited {done.returncode}:\n{done.stderr[-2000:]}"
    assert Path(script).name in done.stdout, f"{script} --help does not name the script:\n{done.stdout[:500]}"
    if script.endswith(".py") and script not in HEAVY_BEFORE_ARGPARSE:
        heavy = sorted(_imported(done.stderr) & HEAVY)
        assert not heavy, f"{script} --help imports {heavy} before parsing its command line"


def test_importtime_log_is_read_as_top_level_names():
    log = ("import time: self [us] | cumulative | imported package\n"
           "import time:       120 |        120 |   torch._C\n"
           "import time:        80 |        300 | numpy\n")
    assert _imported(log) == {"imported package", "torch", "numpy"}
