"""``python -m gigpo_trl.report RUN_DIR [--iterations N ...] [-o FILE] [--max-groups K]`` (see :func:`.page.main`)."""

import sys

from .page import main

if __name__ == "__main__":
    sys.exit(main())
