"""Generate the results pages and README.md's headline table from the figures in ``benchmarks/results/*.json``.

    python scripts/gen_results.py           # rewrite every generated block
    python scripts/gen_results.py --check   # exit 1 naming each block that disagrees with the results files

A generated block sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` in a Markdown page; the
text around it is written by hand. The words of a row live here, every figure comes from a results file
(``benchmarks/results_io.py`` writes them), so a page cannot drift from what was measured.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
MINUS = "\u2212"


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def signed(x: float, digits: int = 1) -> str:
    """``+3.0`` / ``−1.9`` (a true minus sign), ``0.0`` for zero."""
    text = f"{x:+.{digits}f}"
    if float(text) == 0:
        return f"{0:.{digits}f}"
    return text.replace("-", MINUS)


def gap(g: dict, unit: str = "") -> str:
    """``+3.0 pp [−1.9, +7.8]`` from a gap entry (``gap_pp``, ``ci95_pp``)."""
    lo, hi = g["ci95_pp"]
    return f"{signed(g['gap_pp'])}{unit} [{signed(lo)}, {signed(hi)}]"


def thousands(x: float) -> str:
    return f"{x:,.0f}"


# ------------------------------------------------------------------------------------------ README's headline rows
def learning_row() -> str:
    gaps = load("learning")["gaps"]
    first = gap(gaps["GiGPO-GRPO/T=1"], " pp").replace(" [", ", 95 % CI [")
    return (f"GiGPO {first}; HGPO {gap(gaps['HGPO-GRPO/T=1'])}; "
            f"GraphGPO {gap(gaps['GraphGPO-GRPO/T=1'])}")


def map_row() -> str:
    cells = load("map/map")["gaps_to_grpo"]
    gi = {c: v["GiGPO"] for c, v in cells.items() if "GiGPO" in v}
    graph = [v["GraphGPO"]["gap_pp"] for c, v in cells.items() if "GraphGPO" in v and c != "clock"]

    def across_zero(*names):
        return all(gi[n]["ci95_pp"][0] < 0 < gi[n]["ci95_pp"][1] for n in names)

    short = f"{signed(gi['h6']['gap_pp'])} / {signed(gi['h12']['gap_pp'])}"
    return (f"GiGPO: 24 rooms {gap(gi['h24'], ' pp')}, trap door {gap(gi['trap'])}; 6/12 rooms {short}"
            f"{' (across 0)' if across_zero('h6', 'h12') else ''}; a nuisance in the anchor makes it "
            f"{'GRPO exactly' if gi['clock']['gap_pp'] == 0 else signed(gi['clock']['gap_pp'])}, `anchor_state()` "
            f"restores {gap(gi['clock_hook'])}; GraphGPO {signed(min(graph))} to {signed(max(graph))} wherever "
            "states repeat")


def advantage_row() -> str:
    ref = load("bench_advantage")["figures"]["reference"]
    return ", ".join(f"{thousands(v['speedup'])}× ({thousands(int(rows))} rows)" for rows, v in ref.items())


def rollout_row() -> str:
    return f"{load('bench_rollout')['figures']['ratio_greedy']:.2f}×"


def vs_trl_row() -> str:
    calls = load("bench_vs_trl")["figures"]["calls"]
    ratios = " / ".join(f"{v['ratio']:.2f}×" for v in calls.values())
    ours = " / ".join(f"{v['ours_budget_2048_peak_gb']:.2f}" for v in calls.values())
    trl = " / ".join(f"{v['trl_peak_gb']:.2f}" for v in calls.values())
    return (f"{ratios}; peak memory {ours} GB with a 2,048-token budget, TRL's {trl} GB (TRL's length limit spans "
            "the whole episode and cuts it silently)")


def memory_row() -> str:
    s = load("bench_memory")["figures"]["settings"]["checkpointing_on_budget_1024_rows_of_1000"]
    return f"{s['peak_mib'] * 2**20 / 1e9:.2f} GB (CPU)"


# (what, result function, source): the words of each row of README's "Headline results".
HEADLINE = [
    ("learning: gap to GRPO, held-out corridor success, 10 seeds", learning_row,
     "`benchmarks/learning.py`"),
    ("where step credit pays: gap to GRPO over 7 map cells (horizon, anchors, failure cause), 8 fresh seeds each",
     map_row, "[map](benchmarks/results/map/map.png), [reading](benchmarks/README.md), "
              "`benchmarks/learning.py --condition NAME`"),
    ("estimator speed vs the reference's algorithm", advantage_row, "`benchmarks/bench_advantage.py`"),
    ("rollout overhead vs the bare generate calls", rollout_row, "`benchmarks/bench_rollout.py`"),
    ("time vs TRL's multi-turn GRPO, same episodes (3 / 8 / 16 tool calls)", vs_trl_row,
     "`benchmarks/bench_vs_trl.py`, `trl_findings.py`"),
    ("peak memory of the default model, 1,024-token budget", memory_row,
     "`benchmarks/bench_memory.py --default-model`"),
]


def headline_table() -> str:
    rows = ["| what | result | source |", "| --- | --- | --- |"]
    rows += [f"| {what} | {result()} | {source} |" for what, result, source in HEADLINE]
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------ the blocks
BLOCKS = {  # page -> {block name: render function}
    "README.md": {"headline": headline_table},
}


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- results:{name} -->\n)(.*?)(<!-- /results:{name} -->)", re.S)


def render(page: str, text: str) -> str:
    """``text`` of ``page`` with every generated block rewritten; a missing marker raises naming it."""
    for name, fn in BLOCKS[page].items():
        pattern = _block(name)
        if not pattern.search(text):
            raise ValueError(f"{page}: no block <!-- results:{name} --> ... <!-- /results:{name} -->")
        body = fn()
        text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a page disagrees with the results files")
    args = parser.parse_args(argv)
    stale = []
    for page in BLOCKS:
        path = REPO / page
        old = path.read_text()
        new = render(page, old)
        if new != old:
            stale.append(page)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"out of date with benchmarks/results/: {', '.join(stale)} (run python scripts/gen_results.py)")
        return 1
    if not args.check:
        print(f"rewrote {', '.join(stale) or 'nothing (all up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
