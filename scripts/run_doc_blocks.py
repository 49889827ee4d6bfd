"""Run the Python blocks of README.md / docs pages as written (the default model, real sizes), page by page.

    python scripts/run_doc_blocks.py                       # README.md and every docs/*.md page with Python blocks
    python scripts/run_doc_blocks.py docs/environments.md  # one page

tests/test_docs.py runs the same blocks on the tiny test model in seconds; this script is the full-size check
(minutes per training snippet on a CPU). Each page runs in its own namespace, in a temporary working directory
(outputs/ lands there). Exits 1 naming the first block that fails.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return [m.group(2) for m in _FENCE.finditer(page.read_text()) if m.group(1) == "python"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="*", help="Markdown pages (default: README.md and docs/*.md)")
    argv = parser.parse_args(argv).pages
    pages = [Path(p).resolve() for p in argv] or [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    sys.path.insert(0, str(REPO))
    for page in pages:
        blocks = python_blocks(page)
        if not blocks:
            continue
        namespace: dict = {"__name__": f"docs_{page.stem}"}
        with tempfile.TemporaryDirectory() as work:
            cwd = os.getcwd()
            os.chdir(work)
            try:
                for i, block in enumerate(blocks):
                    start = time.perf_counter()
                    try:
                        exec(compile(block, f"{page.name} block {i}", "exec"), namespace)
                    except Exception:
                        traceback.print_exc()
                        print(f"[run_doc_blocks] FAIL {page.relative_to(REPO)} block {i}", flush=True)
                        return 1
                    print(f"[run_doc_blocks] ok {page.relative_to(REPO)} block {i} "
                          f"({time.perf_counter() - start:.1f} s)", flush=True)
            finally:
                os.chdir(cwd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
