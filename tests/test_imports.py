"""Every module of the package imports alone: no import cycle, no module that works only after another was imported.

A test that imports modules inside pytest's process cannot see a cycle (earlier test files have imported
``gigpo_trl.envs`` already), so each module is imported in a child process that has never loaded any ``gigpo_trl``
module. The children are forked from one fresh interpreter that has loaded only the heavy third-party libraries
(torch, transformers, TRL, ...), so the whole package is checked in seconds rather than one torch import per module.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "gigpo_trl"

# Run in a fresh interpreter: preload third-party libraries, then fork one child per module.
_DRIVER = r"""
import importlib, json, os, sys, traceback
for lib in ("torch", "transformers", "trl", "datasets", "accelerate", "peft"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not any(m == "gigpo_trl" or m.startswith("gigpo_trl.") for m in sys.modules), "parent loaded gigpo_trl"
failures = {}
for name in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            importlib.import_module(name)
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        os.close(write)
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failures[name] = message or f"child exited with status {status}"
print(json.dumps(failures))
"""


def package_modules() -> list[str]:
    """Dotted names of every module of the package (``__init__`` as its package), from the source tree."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


def test_package_modules_lists_the_package():
    names = package_modules()
    assert "gigpo_trl" in names and "gigpo_trl.parsing" in names and "gigpo_trl.envs.base" in names
    assert len(names) == len(set(names))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_module_imports_alone_in_a_fresh_process():
    names = package_modules()
    out = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(names)], capture_output=True, text=True,
                         timeout=600, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-4000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failures, "\n\n".join(f"import {name} failed:\n{tb}" for name, tb in failures.items())
