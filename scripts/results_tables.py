"""The tables of ``scripts/gen_results.py`` that read the map, the headline and the estimator cost benchmark, as pure
functions of the loaded results (``map.json``, ``learning.json``, ``bench_estimator_cost.json``): ``gen_results``
loads the files and places the text; here every figure of a row is formatted and every missing one says "pending".

Which arms a map cell has comes from ``benchmarks/learning/settings.py`` (``CONDITIONS[cell]["arms"]``, else every
arm of ``ARMS``), the rule ``map.py`` uses for ``pending``, so an arm pre-registered after a cell's ``map.json``
was written reads "pending" there, and an arm the cell leaves out reads "not an arm".
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from learning.settings import ARMS, CONDITIONS, HEADLINE_SEEDS, MAP_SEEDS  # noqa: E402
from learning.map import (REPAIRED, critic_quality, grpo_rerun_gap,  # noqa: E402,F401  (gen_results's headline)
                          repaired_gaps)

MINUS = "\u2212"
PENDING = "pending"
MAP_CELLS = {  # cell -> its label in the tables
    "h6": "`h6` (6 rooms)", "h12": "`h12` (12 rooms; exact anchors; diffuse failure)", "h24": "`h24` (24 rooms)",
    "clock": "`clock` (nuisance, exact anchors)", "clock_sim": "`clock_sim` (nuisance, similarity 0.9)",
    "clock_hook": "`clock_hook` (nuisance, `anchor_state()`)", "trap": "`trap` (12 rooms, trap door)",
}
MAP_ARMS = ("GiGPO", "HGPO", "GraphGPO", "G2PO", "RLOO", "PPO")
# benchmarks/experiments/baselines_arm.md: the primary comparisons, then the secondary ones
BASELINE_PAIRS = ("RLOO-GRPO", "PPO-GRPO", "PPO-GiGPO", "PPO-G2PO", "RLOO-GiGPO")
LEARNING_PAIRS = ("GiGPO-GRPO", "HGPO-GRPO", "GraphGPO-GRPO", "HGPO-GiGPO", "GraphGPO-GiGPO", "G2PO-GRPO",
                  "G2PO-GraphGPO", "G2PO-GiGPO") + BASELINE_PAIRS
COST_COMMAND = "python benchmarks/bench_estimator_cost.py"


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


def seed_range(seeds: list[int]) -> str:
    return f"{min(seeds)}-{max(seeds)}"


def cell_arms(cell: str) -> tuple[str, ...]:
    """The arms pre-registered for map cell ``cell`` (GRPO included)."""
    return tuple(CONDITIONS[cell].get("arms", ARMS))


def pair_label(pair: str) -> str:
    return f" {MINUS} ".join(pair.split("-"))


def cell_gap(m: dict, cell: str, pair: str) -> str:
    """The paired gap ``pair`` ("X-Y") of map cell ``cell`` from ``map.json`` ``m`` (``gaps_to_grpo`` for "X-GRPO",
    else ``gaps_between``): the gap with its interval; "not an arm" when X is none of the cell's arms, "no Y arm"
    when Y is none; "pending" until the cell's report has it."""
    x, y = pair.split("-")
    if x not in cell_arms(cell):
        return "not an arm"
    if y not in cell_arms(cell):
        return f"no {y} arm"
    g = map_gap(m, cell, pair)
    return gap(g) if g else PENDING


def map_gap(m: dict, cell: str, pair: str) -> dict | None:
    """The paired gap ``pair`` ("X-Y") of map cell ``cell`` in ``map.json`` ``m`` (``gaps_to_grpo`` for "X-GRPO",
    else ``gaps_between``), or None."""
    x, y = pair.split("-")
    return (m["gaps_to_grpo"].get(cell, {}).get(x) if y == "GRPO"
            else m.get("gaps_between", {}).get(cell, {}).get(pair))


def map_table(m: dict) -> str:
    """The map page's table: every arm's gap to GRPO in every cell."""
    rows = ["| cell | " + " | ".join(f"{arm} {MINUS} GRPO" for arm in MAP_ARMS) + " |",
            "|---" * (len(MAP_ARMS) + 1) + "|"]
    for cell, label in MAP_CELLS.items():
        rows.append(f"| {label} | " + " | ".join(cell_gap(m, cell, f"{arm}-GRPO") for arm in MAP_ARMS) + " |")
    return "\n".join(rows)


def critic_cell(q: dict | None) -> str:
    """PPO's critic in one cell (``learning.map.critic_quality``): its explained variance at the first iteration →
    over the last 3, and its mean absolute value error over the last 3; "pending" before PPO ran there."""
    if not q:
        return PENDING
    return (f"{signed(q['explained_variance_first'], 2)} → {signed(q['explained_variance_last3'], 2)} "
            f"(error {q['value_error_last3']:.2f})")


def baselines_table(m: dict, gaps: dict, headline_rerun: dict | None = None,
                    headline_critic: dict | None = None) -> str:
    """RLOO's and PPO's pre-registered comparisons per map cell (``map.json`` ``m``) and on the headline seeds
    (``gaps``: the headline's, with the baselines' own folded in): held-out success sampled at T = 1, mean of the
    last 3 evaluations; then GRPO re-run beside them minus the recorded GRPO (``m["baselines"]``,
    ``headline_rerun``: the same paired gap on the headline seeds) and what PPO's critic learned
    (:func:`critic_cell`; ``headline_critic`` on the headline seeds), "pending" until run."""
    heads = [pair_label(p) + (" (primary)" if p.endswith("-GRPO") else "") for p in BASELINE_PAIRS]
    heads += [f"GRPO re-run {MINUS} recorded", "PPO's critic: explained variance, first → last 3 iterations"]
    rows = ["| cell | seeds | " + " | ".join(heads) + " |", "|---|---" + "|---" * len(heads) + "|"]
    for cell, label in MAP_CELLS.items():
        folded = m.get("baselines", {}).get(cell) or {}
        rerun = folded.get("grpo_rerun_minus_recorded")
        rows.append(f"| {label} | {seed_range(MAP_SEEDS)} | "
                    + " | ".join(cell_gap(m, cell, p) for p in BASELINE_PAIRS)
                    + f" | {gap(rerun) if rerun else PENDING} | {critic_cell(folded.get('ppo_critic'))} |")
    rows.append(f"| headline corridor (12 rooms) | {seed_range(HEADLINE_SEEDS)} | " + " | ".join(
        gap(gaps[f"{p}/T=1"]) if f"{p}/T=1" in gaps else PENDING for p in BASELINE_PAIRS)
        + f" | {gap(headline_rerun) if headline_rerun else PENDING} | {critic_cell(headline_critic)} |")
    return "\n".join(rows)


def learning_table(gaps: dict) -> str:
    """The headline page's table: every pair's gap in the three metrics, "pending" until ``learning.json`` has it."""
    rows = ["| gap | held-out success, sampled T = 1 (primary) | AUC, T = 1 | greedy |", "|---|---|---|---|"]
    for pair in LEARNING_PAIRS:
        if pair + "/T=1" not in gaps:
            rows.append(f"| {pair_label(pair)} | {PENDING} | {PENDING} | {PENDING} |")
            continue
        rows.append(f"| {pair_label(pair)} | {gap(gaps[pair + '/T=1'])} | {gap(gaps[pair + '/AUC T=1'])} | "
                    f"{gap(gaps[pair + '/greedy'])} |")
    return "\n".join(rows)


def arm_cells(cells: dict, arm: str) -> str:
    """``arm``'s range of gaps to GRPO over the map's cells (``map.json``'s ``gaps_to_grpo``), in how many of the
    cells it is an arm of, and whether every interval lies above, below or across 0; "ARM pending" before any."""
    g = [v[arm] for v in cells.values() if arm in v]
    if not g:
        return f"{arm} {PENDING}"
    of = sum(arm in cell_arms(c) for c in MAP_CELLS)
    where = f"all {len(g)}" if len(g) == of else f"{len(g)} of {of}"
    lows, highs = [x["ci95_pp"][0] for x in g], [x["ci95_pp"][1] for x in g]
    side = (", every interval above 0" if min(lows) > 0 else ", every interval below 0" if max(highs) < 0
            else ", every interval across 0" if all(lo <= 0 <= hi for lo, hi in zip(lows, highs)) else "")
    rerun = " (against GRPO re-run beside it)" if arm in REPAIRED else ""
    if len(g) == 1:  # one cell: its gap and interval, not a range
        return f"{arm} {gap(g[0])} in 1 of {of} cells{rerun}"
    return (f"{arm} {signed(min(x['gap_pp'] for x in g))} to {signed(max(x['gap_pp'] for x in g))} in {where} "
            f"cells{side}{rerun}")


def baselines_reading(m: dict) -> str:
    """The RLOO and PPO arms over the map so far (``map.json`` ``m``): each arm's range of gaps to GRPO
    (:func:`arm_cells`) and the range of PPO's critic's explained variance, first iteration and last 3, over the
    cells folded; "pending" before any."""
    q = [b["ppo_critic"] for b in m.get("baselines", {}).values() if b.get("ppo_critic")]
    arms = "; ".join(arm_cells(m["gaps_to_grpo"], arm) for arm in REPAIRED)
    if not q:
        return f"So far: {arms}; PPO's critic {PENDING}."

    def span(key, fmt=lambda v: signed(v, 2)):
        lo, hi = min(x[key] for x in q), max(x[key] for x in q)
        return fmt(lo) if lo == hi else f"{fmt(lo)} to {fmt(hi)}"

    return (f"So far: {arms}. PPO's critic, explained variance of its values at the first iteration "
            f"{span('explained_variance_first')}, over the last 3 {span('explained_variance_last3')} "
            f"(mean absolute value error {span('value_error_last3', lambda v: f'{v:.2f}')}), in {len(q)} "
            f"cell{'s' if len(q) > 1 else ''}.")


# ------------------------------------------------------------------------------------------ estimator cost
def cost_missing(name: str = "bench_estimator_cost", command: str = COST_COMMAND) -> str:
    return (f"Not recorded yet: `{command}` writes `benchmarks/results/{name}.json`, and this table is generated "
            "from it.")


def cost_table(result: dict | None, missing: str | None = None) -> str:
    """Per arm of ``bench_estimator_cost.json`` or ``bench_estimator_cost_llm.json`` (``result``; ``None``: not
    recorded, then ``missing`` or :func:`cost_missing`'s line): peak resident memory, its difference to GRPO's,
    seconds per training iteration and their split, rows, held-out success, model sizes (trained and whole for the
    LLM record) and the machine load; then the run's cell, seed, command, commit, date and machine."""
    if result is None:
        return missing or cost_missing()
    f = result["figures"]
    arms = f["arms"]
    base = arms.get("GRPO", {}).get("peak_rss_mb")
    rows = ["| arm | peak RSS (MB) | vs GRPO | training s / iteration: wall (CPU) | rollout | advantages | rest | "
            "rows / iteration | held-out success | parameters | load before → after |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, a in arms.items():
        vs = ("—" if base is None or arm == "GRPO"
              else f"{signed(a['peak_rss_mb'] - base, 0)} MB ({signed(100 * (a['peak_rss_mb'] / base - 1), 0)} %)")
        rows.append(f"| {arm} | {a['peak_rss_mb']:,.0f} | {vs} | {a['train_wall_seconds_per_iteration']:.2f} "
                    f"({a['train_cpu_seconds_per_iteration']:.2f}) | {a['rollout_seconds_per_iteration']:.2f} | "
                    f"{a['advantage_seconds_per_iteration']:.4f} | {a['rest_seconds_per_iteration']:.2f} | "
                    f"{a['rows_per_iteration']:,.0f} | {a['held_out_success_last3']:.3f} | {_params(a)} | "
                    f"{a['load'][0]:.2f} → {a['load'][1]:.2f} |")
    iters = {a.get("iterations") for a in arms.values()} - {None}
    rows += ["", f"Cell `{f['condition']}`, seed {f['seed']}"
                 + (f", {', '.join(map(str, sorted(iters)))} iterations" if iters else "")
                 + f", one run per arm in turn from one warm-up: `{result['command']}` at commit {result['commit']}, "
                   f"{result['date']}, `{result['machine']}`." + _arm_commits(arms, result["commit"])]
    return "\n".join(rows)


def _arm_commits(arms: dict, commit: str) -> str:
    """Where a resumed record's arms ran at other commits than the record's: which arms at which commit and date."""
    at: dict[tuple, list[str]] = {}
    for arm, a in arms.items():
        at.setdefault((a.get("commit", commit), a.get("date")), []).append(arm)
    if {c for c, _ in at} == {commit}:
        return ""
    return " Arms measured at: " + "; ".join(
        f"{', '.join(names)} at {c}" + (f" ({d})" if d else "") for (c, d), names in at.items()) + "."


def _params(a: dict) -> str:
    """The parameters column: the policy's (and its critic's); for an LLM record (``--model``) the trained ones."""
    if "policy_trainable_params" in a:
        critic = f" + critic {a['critic_trainable_params']:,}" if "critic_trainable_params" in a else ""
        return f"{a['policy_trainable_params']:,} of {a['policy_params']:,} trained{critic}"
    return f"{a['policy_params']:,}" + (f" + critic {a['critic_params']:,}" if "critic_params" in a else "")


def cost_row(result: dict | None, command: str = COST_COMMAND) -> str:
    """README's headline cell of the cost benchmark: each arm's peak memory and training CPU s per iteration;
    "pending" with ``command`` before its record exists."""
    if result is None:
        return f"{PENDING} (`{command}` not recorded yet)"
    f = result["figures"]
    arms = f["arms"]
    peaks = ", ".join(f"{arm} {a['peak_rss_mb']:,.0f}" for arm, a in arms.items())
    cpu = " / ".join(f"{a['train_cpu_seconds_per_iteration']:.2f}" for a in arms.values())
    return (f"peak RSS {peaks} MB; training CPU s per iteration {cpu} (`{f['condition']}`, seed {f['seed']}, "
            "one run each)")


# ------------------------------------------------------------------------------------------ the LLM study
LLM_PAIRS = ("GiGPO-GRPO", "G2PO-GRPO", "G2PO-GiGPO")  # benchmarks/experiments/llm_learning.md: primary, secondary
LLM_COMMAND = "benchmarks/experiments/llm_learning.md, \"Runs\""


def llm_missing() -> str:
    return (f"{PENDING}: the pre-registered runs ({LLM_COMMAND}) write "
            "`benchmarks/results/llm_learning/h12/learning.json`, and this is generated from it")


def llm_table(result: dict | None) -> str:
    """The LLM study's report (``llm_learning/h12/learning.json``; ``None``: not recorded): each pre-registered gap
    (held-out success sampled at T = 1, mean of the last 3 evaluations; the area under the curve) with its 95 %
    interval, then per arm the mean over seeds of its iteration-0 and last-3 success, its training CPU seconds per
    iteration and its largest peak resident memory; then seeds, command, commit, date and machine."""
    if result is None:
        return llm_missing() + "."
    g = result["gaps"]
    rows = ["| gap | held-out success, sampled T = 1 (primary: the first two) | AUC, T = 1 |", "|---|---|---|"]
    rows += [f"| {pair_label(p)} | {gap(g[p + '/T=1'], ' pp') if p + '/T=1' in g else PENDING} | "
             f"{gap(g[p + '/AUC T=1'], ' pp') if p + '/AUC T=1' in g else PENDING} |" for p in LLM_PAIRS]
    runs = result["runs"]
    rows += ["", "| arm | success at iteration 0 | success, last 3 evaluations | training CPU s / iteration | "
                 "peak RSS (MB) |", "|---|---|---|---|---|"]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for arm in result["arms"]:
        mine = [r for r in runs if r["arm"] == arm]
        start = mean([r["points"][0]["sampled"] for r in mine])
        rows.append(f"| {arm} | {start:.3f} | {mean([r['headline_sampled'] for r in mine]):.3f} | "
                    f"{mean([r['train_cpu_seconds_per_iteration'] for r in mine]):.0f} | "
                    f"{max(r['peak_rss_mb'] for r in mine):,.0f} |")
    rows += ["", f"Seeds {', '.join(map(str, result['seeds']))} (means over them); `{result['command']}` at commit "
                 f"{result['commit']}, {result['date']}, `{result['machine']}`."]
    return "\n".join(rows)


def llm_vs_tiny(result: dict | None, m: dict) -> str:
    """The map page's comparison of the LLM study (``result``, its report) with the same cell on the tiny policy
    (``map.json`` ``m``, cell ``h12``): per pre-registered gap to GRPO, both with their intervals; "pending" for the
    LLM before its report exists."""
    rows = ["| gap, `h12` | SmolLM2-135M-Instruct, LoRA (the LLM study) | the map's 100k-parameter policy |",
            "|---|---|---|"]
    for pair in LLM_PAIRS:
        llm = (result or {}).get("gaps", {}).get(pair + "/T=1")
        small = map_gap(m, "h12", pair)
        rows.append(f"| {pair_label(pair)} | {gap(llm, ' pp') if llm else PENDING} | "
                    f"{gap(small, ' pp') if small else PENDING} |")
    seeds = f"seeds {seed_range(result['seeds'])}" if result else "the pre-registered seeds"
    return "\n".join(rows) + (f"\n\nHeld-out success sampled at T = 1, mean of the last 3 evaluations; the LLM over "
                              f"{seeds}, the tiny policy over seeds {seed_range(MAP_SEEDS)}.")


def llm_row(result: dict | None) -> str:
    """README's headline cell of the LLM study: the two primary gaps with their intervals."""
    if result is None:
        return llm_missing()
    g = result["gaps"]
    return ("; ".join(f"{pair_label(p)} {gap(g[p + '/T=1'], ' pp')}" for p in LLM_PAIRS[:2] if p + "/T=1" in g)
            + f" ({len(result['seeds'])} seeds)")
