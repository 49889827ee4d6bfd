"""Run a documentation example as written, on the default model, and print what it measures.

    python benchmarks/doc_example.py README.md              # the notebook snippet (WebShop, ~13 min on 2 cores)
    python benchmarks/doc_example.py docs/environments.md   # the Hanoi TRL example (~3 min)

Takes the page's Python block that calls ``expert_warmup(trainer, ...)``, runs it unchanged except that each
top-level ``trainer.evaluate()`` and ``expert_warmup(...)`` line also prints its result (``EVAL {...}``,
``WARMUP {...}``), then prints the seconds the block took (``DONE N s``). Run it with ``HF_HUB_OFFLINE=1`` and
``OMP_NUM_THREADS=2``, from any folder (the example writes under ``outputs/``). Figures: benchmarks/README.md."""
import argparse
import re
import resource
import time
from pathlib import Path

from results_io import write_result

PAGE_NAMES = {"README": "readme_notebook", "environments": "hanoi"}  # page -> its entry in results/doc_example.json


def example_source(page: Path) -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", page.read_text(), re.S) if "expert_warmup(trainer" in b]
    if len(blocks) != 1:
        raise SystemExit(f"{page}: expected one python block calling expert_warmup(trainer, ...), found {len(blocks)}")
    lines = []
    for line in blocks[0].splitlines():
        call = line.split("#")[0].strip()
        if line.startswith("trainer.evaluate()"):
            line = f"print('EVAL', _evaluations.append({call}) or _evaluations[-1], flush=True)"
        elif line.startswith("expert_warmup("):
            line = f"print('WARMUP', {call}, flush=True)"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("page", help="README.md or a docs/ page holding one block that calls expert_warmup(trainer, ...)")
    page = Path(parser.parse_args().page)
    if not page.is_absolute() and not page.exists():
        page = Path(__file__).resolve().parent.parent / page
    source = example_source(page)
    evaluations: list[dict] = []
    start = time.perf_counter()
    exec(compile(source, f"{page.name} example", "exec"), {"__name__": "doc_example", "_evaluations": evaluations})
    seconds = time.perf_counter() - start
    print(f"DONE {seconds:.0f} s", flush=True)
    if evaluations:
        name = PAGE_NAMES.get(page.stem, page.stem)
        write_result("doc_example", {name: {
            "success_before": evaluations[0].get("eval_success_rate"),
            "success_after": evaluations[-1].get("eval_success_rate"), "seconds": round(seconds),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 1)}},
            recorded=True, merge=True)


if __name__ == "__main__":
    main()
