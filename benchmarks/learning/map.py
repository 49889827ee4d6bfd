"""The map: the gap to GRPO of every arm in every cell (condition) of the map, its table, ``map.json`` and figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from results_io import provenance

from .settings import ARM_COLORS, ARMS, CONDITIONS, MAP_AXES, MAP_AXIS_LABELS
from .statistics import METRICS, PRIMARY_METRIC, paired_gap

BETWEEN = ("G2PO-GraphGPO", "G2PO-GiGPO", "PPO-GiGPO", "PPO-G2PO", "RLOO-GiGPO")  # map.json's gaps_between: pairs of arms other than the gap to GRPO


def map_table(cells: dict) -> tuple[str, dict]:
    """The map's table: per condition (``cells``: condition -> its learning.json) and arm, the paired gap to GRPO
    of the primary metric and its 95 % t interval. Returns (text, {condition: {arm: gap_stats dict}})."""
    label = METRICS[PRIMARY_METRIC][0]
    rows, out = [], {}
    head = f"{'condition':<11} {'seeds':>5} " + " ".join(f"{arm + ' - GRPO':>24}" for arm in ARMS if arm != "GRPO")
    rows += [f"gap to GRPO, {METRICS[PRIMARY_METRIC][1]} (pp, 95% t interval over seeds):", head, "-" * len(head)]
    for cond in CONDITIONS:
        if cond not in cells:
            continue
        d = cells[cond]
        out[cond] = {}
        cols = []
        for arm in ARMS:
            if arm == "GRPO":
                continue
            g = d["gaps"].get(f"{arm}-GRPO/{label}")
            if g is None:
                cols.append(f"{'-':>24}")
                continue
            out[cond][arm] = g
            cols.append(f"{g['gap_pp']:+6.1f} [{g['ci95_pp'][0]:+6.1f}, {g['ci95_pp'][1]:+6.1f}]".rjust(24))
        rows.append(f"{cond:<11} {len(d['seeds']):>5} " + " ".join(cols))
    return "\n".join(rows), out


REPAIRED = ("RLOO", "PPO")  # arms paired with a GRPO re-run beside them (benchmarks/experiments/baselines_arm.md)


def repaired_gaps(report: dict) -> dict:
    """The ``REPAIRED`` arms' gaps of a learning.json ``report`` that ran them beside re-runs of the arms they are
    compared with (``ARM-GRPO/METRIC``, and the secondary ``ARM-GiGPO/...``, ``ARM-G2PO/...`` once GiGPO and G2PO
    were re-run into the same cell): the only gaps of such a report that may join a recorded report's (a gap
    between two recorded arms stays the recorded one)."""
    pairs = {f"{arm}-{other}" for arm in REPAIRED for other in ("GRPO", "GiGPO", "G2PO")}
    return {k: v for k, v in report["gaps"].items() if k.split("/")[0] in pairs}


def grpo_rerun_gap(report: dict, recorded: dict) -> dict | None:
    """The GRPO re-run of ``report`` minus the GRPO of ``recorded`` (two learning.json reports), the primary metric
    paired by the seeds both ran (pp, ``paired_gap``), or None when they share no seed."""
    rerun = {r["seed"]: r[PRIMARY_METRIC] for r in report.get("runs", []) if r["arm"] == "GRPO"}
    old = {r["seed"]: r[PRIMARY_METRIC] for r in recorded.get("runs", []) if r["arm"] == "GRPO"}
    seeds = sorted(set(rerun) & set(old))
    return paired_gap(seeds, [100 * (rerun[s] - old[s]) for s in seeds]) if seeds else None


def critic_quality(report: dict) -> dict | None:
    """How much PPO's critic learned in the runs of a learning.json ``report``: the explained variance of its values
    (``critic/explained_variance``, 1 − Var(G − V) / Var(G); 0 is a constant, the returns' mean) and its mean
    absolute value error (``critic/value_error``, in reward units) at the first iteration and over the last 3,
    each the mean over the seeds (iterations where the returns did not vary, logged nan, left out). None without
    PPO runs."""
    runs = [r for r in report.get("runs", []) if r["arm"] == "PPO" and r["series"].get("critic/explained_variance")]
    if not runs:
        return None

    def mean(key, part: slice):
        return round(float(np.nanmean([np.nanmean(r["series"][key][part]) for r in runs])), 4)

    first, last3 = slice(None, 1), slice(-3, None)
    return {"seeds": len(runs), "explained_variance_first": mean("critic/explained_variance", first),
            "explained_variance_last3": mean("critic/explained_variance", last3),
            "value_error_first": mean("critic/value_error", first),
            "value_error_last3": mean("critic/value_error", last3)}


def fold_baselines(cells: dict, baselines_dir: Path) -> dict:
    """Fold the gaps of the ``REPAIRED`` arms from ``baselines_dir/CONDITION/learning.json`` (their cell's
    invocation with a GRPO re-run, on another CPU model than the recorded arms) into ``cells`` (condition -> the
    recorded learning.json, changed in place: their gaps to the re-run arms only, :func:`repaired_gaps`; never a gap
    between them and a recorded arm). Returns, per folded cell, ``{"seeds", "cpu_models", "grpo_rerun_minus_recorded", "ppo_critic"}``:
    the re-run GRPO minus the recorded GRPO of the same seeds, the primary metric (pp, paired by seed; the map's
    reproducibility on another CPU model), and what PPO's critic learned (:func:`critic_quality`)."""
    out = {}
    for cond, d in cells.items():
        path = baselines_dir / cond / "learning.json"
        if not path.exists():
            continue
        b = json.loads(path.read_text())
        d["gaps"] = {**d["gaps"], **repaired_gaps(b)}
        out[cond] = {"seeds": b["seeds"], "cpu_models": sorted({r.get("cpu_model") or "?" for r in b.get("runs", [])}),
                     "grpo_rerun_minus_recorded": grpo_rerun_gap(b, d), "ppo_critic": critic_quality(b)}
    return out


def map_report(map_dir, baselines_dir=None) -> int:
    """--map_report: read ``map_dir/CONDITION/learning.json`` of every cell present (with the RLOO and PPO gaps of
    ``baselines_dir``, default ``map_dir/../map_baselines``: :func:`fold_baselines`), print the table, write
    ``map_dir/map.json`` and the figure ``map_dir/map.png`` (gap to GRPO with its 95 % interval per arm, one panel
    per axis of ``MAP_AXES``). Returns 1 when no cell is there."""
    map_dir = Path(map_dir)
    cells = {c: json.loads((map_dir / c / "learning.json").read_text()) for c in CONDITIONS
             if (map_dir / c / "learning.json").exists()}
    if not cells:
        print(f"no cell of the map under {map_dir} (expected {map_dir}/CONDITION/learning.json)")
        return 1
    baselines = fold_baselines(cells, Path(baselines_dir) if baselines_dir else map_dir.parent / "map_baselines")
    missing = [c for c in CONDITIONS if c not in cells]
    partial = [c for c, d in cells.items() if not d.get("is_map_cell")]
    table, gaps = map_table(cells)
    print(table)
    # arms of a cell (CONDITIONS' ``arms``, else every arm) that its report does not have yet
    pending = {c: [arm for arm in CONDITIONS[c].get("arms", ARMS) if arm != "GRPO" and arm not in gaps[c]]
               for c in cells}
    pending = {c: arms for c, arms in pending.items() if arms}
    if missing:
        print(f"cells missing: {missing}")
    if pending:
        print("arms pending (not in the cell's report yet): "
              + "; ".join(f"{c}: {', '.join(arms)}" for c, arms in pending.items()))
    if partial:
        print(f"cells that are not complete map cells (seeds, iterations or eval tasks differ): {partial}")
    # paired gaps between step-level arms (G2PO's secondary comparisons), where a cell's report has them
    label = METRICS[PRIMARY_METRIC][0]
    between = {c: {pair: d["gaps"][f"{pair}/{label}"] for pair in BETWEEN if f"{pair}/{label}" in d["gaps"]}
               for c, d in cells.items()}
    (map_dir / "map.json").write_text(json.dumps({
        **provenance(),
        "primary_metric": PRIMARY_METRIC, "gaps_to_grpo": gaps, "missing": missing, "partial": partial,
        "pending": pending, "gaps_between": {c: g for c, g in between.items() if g},
        "seeds": {c: d["seeds"] for c, d in cells.items()}, "baselines": baselines, "table": table}, indent=1,
        default=float))
    plot_map(gaps, map_dir / "map.png")
    print(f"json: {map_dir / 'map.json'}")
    return 0


def plot_map(gaps: dict, path) -> None:
    """One panel per axis of ``MAP_AXES``: for each cell present, each arm's gap to GRPO (pp) with its 95 %
    interval as an error bar, arms side by side; a dashed line at 0 (= GRPO)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = ARM_COLORS
    arms = [arm for arm in ARMS if arm != "GRPO"]
    fig, axes = plt.subplots(1, len(MAP_AXES), figsize=(5 * len(MAP_AXES), 4.2), sharey=True)
    for ax, (axis, conds) in zip(axes, MAP_AXES.items()):
        conds = [c for c in conds if c in gaps]
        for j, arm in enumerate(arms):
            xs, ms, los, his = [], [], [], []
            for i, c in enumerate(conds):
                g = gaps[c].get(arm)
                if g is None:
                    continue
                lo, hi = g["ci95_pp"]
                xs.append(i + (j - (len(arms) - 1) / 2) * 0.8 / len(arms))
                ms.append(g["gap_pp"])
                los.append(g["gap_pp"] - lo if np.isfinite(lo) else 0.0)
                his.append(hi - g["gap_pp"] if np.isfinite(hi) else 0.0)
            if xs:
                ax.errorbar(xs, ms, yerr=[los, his], fmt="o", capsize=4, color=colors[arm], label=arm)
        ax.axhline(0.0, color="tab:orange", ls="--", lw=1, label="GRPO")
        ax.set_xticks(range(len(conds)))
        ax.set_xticklabels([MAP_AXIS_LABELS.get((axis, c), CONDITIONS[c]["label"]) for c in conds])
        ax.set(title=f"against {axis}", xlim=(-0.6, max(len(conds), 1) - 0.4))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"gap to GRPO, pp ({METRICS[PRIMARY_METRIC][0]}, last 3 evaluations)")
    axes[0].legend(loc="best")
    fig.suptitle("Where step credit pays: gap to GRPO per arm, mean and 95% t interval over seeds (corridor)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")
