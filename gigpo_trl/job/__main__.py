"""``python -m gigpo_trl.job [--env NAME] [--flag value ...]``: the job of ``examples/train_<NAME>.py`` (default
``webshop``) with that example's defaults."""

from __future__ import annotations

import sys

from .arguments import EXAMPLE_DEFAULTS
from .runner import main


def split_env(argv: list[str], default: str = "webshop") -> tuple[str, list[str]]:
    """``(environment name, the other arguments)`` of ``argv``: ``--env NAME`` or ``--env=NAME`` (default
    ``default``) is taken out, as the example scripts fix it.

    Raises:
        SystemExit: exit code 2 with one ``[gigpo] error`` line when ``--env`` has no value or names an environment
            without an example (the message lists them).
    """
    rest, env = [], default
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--env" or arg.startswith("--env="):
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            if value not in EXAMPLE_DEFAULTS:
                print(f"[gigpo] error: --env must be one of {sorted(EXAMPLE_DEFAULTS)}, got {value!r} (the "
                      "environments with an example job; your own environment trains from Python: "
                      "docs/environments.md)", file=sys.stderr, flush=True)
                sys.exit(2)
            env = value
            continue
        rest.append(arg)
        i += 1
    return env, rest


if __name__ == "__main__":
    # The usage line's program name; --env is taken out before parsing, so --help would not list it otherwise.
    sys.argv[0] = f"python -m gigpo_trl.job [--env {{{','.join(sorted(EXAMPLE_DEFAULTS))}}}]"
    main(*split_env(sys.argv[1:]))
