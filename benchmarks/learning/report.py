"""The learning benchmark's report: the per-seed table and paired gaps, the learning curves, ``learning.json``."""

from __future__ import annotations

import json

import numpy as np
from results_io import provenance

from .settings import ARM_COLORS, ARMS, HEADLINE_SEEDS, MAP_SEEDS
from .statistics import METRICS, PRIMARY_METRIC, SIZE_BINS, T975, bin_label, gap_stats, present_metrics
from .warmup import warmup_line


def _cell(value, width: int) -> str:
    """``value`` to 3 decimals in ``width`` characters; "-" for an absent metric (None, e.g. greedy not evaluated)."""
    return f"{'-':>{width}}" if value is None else f"{value:{width}.3f}"


def _mean(values):
    """The mean, or None when a value is absent (a metric the runs do not all hold)."""
    return None if any(v is None for v in values) else float(np.mean(values))


def report(results, seeds, arms, a, warmups=None):
    """The text report and the paired gaps (``gap_stats`` per arm pair and metric of ``METRICS`` that every run
    holds, ``present_metrics``, keyed ``"{x}-{y}/{label}"``) of the runs ``results[(seed, arm)]`` over ``seeds``; a
    metric absent from the runs (greedy, with ``--greedy_evals start`` or ``none``) has no gap and is shown "-"."""
    lines = []
    metrics = present_metrics(results[(s, arm)] for s in seeds for arm in arms)
    head = f"{'seed':>4} " + " ".join(f"{arm + ' T=1':>11} {arm + ' greedy':>12} {arm + ' AUC':>10}" for arm in arms)
    lines += ["held-out success, mean of the last 3 evaluations (iterations "
              f"{', '.join(str(p['iteration']) for p in results[(seeds[0], arms[0])]['points'][-3:])}), and the "
              f"area under the sampled held-out success curve (AUC; evaluations at iterations "
              f"{', '.join(str(p['iteration']) for p in results[(seeds[0], arms[0])]['points'])}):", head,
              "-" * len(head)]
    widths = {"headline_sampled": 11, "headline_greedy": 12, "auc_sampled": 10}
    for s in seeds:
        lines.append(f"{s:>4} " + " ".join(" ".join(_cell(results[(s, arm)].get(k), w) for k, w in widths.items())
                                           for arm in arms))
    lines.append("-" * len(head))
    lines.append(f"{'mean':>4} " + " ".join(" ".join(
        _cell(_mean([results[(s, arm)].get(k) for s in seeds]), w) for k, w in widths.items()) for arm in arms))
    pairs = [(x, y) for x, y in (("GiGPO", "GRPO"), ("HGPO", "GiGPO"), ("HGPO", "GRPO"), ("GraphGPO", "GiGPO"),
                                 ("GraphGPO", "GRPO"), ("G2PO", "GRPO"), ("G2PO", "GraphGPO"),
                                 ("G2PO", "GiGPO"), ("RLOO", "GRPO"), ("PPO", "GRPO"), ("PPO", "GiGPO"),
                                 ("PPO", "G2PO"), ("RLOO", "GiGPO")) if x in arms and y in arms]
    gaps = {}
    lines.append("")
    lines.append(f"paired gaps over seeds (percentage points; 95% t interval, df = seeds - 1); primary metric: "
                 f"{METRICS[PRIMARY_METRIC][0]} ({METRICS[PRIMARY_METRIC][1]}):")
    absent = [label for key, (label, _) in METRICS.items() if key not in metrics]
    if absent:
        lines.append(f"  absent from the runs (not evaluated; --greedy_evals "
                     f"{getattr(a, 'greedy_evals', 'schedule')}): {', '.join(absent)}")
    for x, y in pairs:
        for key, (label, _) in metrics.items():
            g = gap_stats(results, seeds, x, y, key)
            gaps[f"{x}-{y}/{label}"] = g
            lines.append(f"  {x} - {y} ({label:7s}): {g['gap_pp']:+6.1f} pp  [{g['ci95_pp'][0]:+6.1f}, "
                         f"{g['ci95_pp'][1]:+6.1f}]   per seed: "
                         + ", ".join(f"{v:+.1f}" for v in g["per_seed_pp"].values()))
    if warmups:
        lines.append("")
        lines.append("warm-ups (final sampled check; the same recipe for every seed):")
        for s in seeds:
            w = warmups.get(str(s)) or warmups.get(s)
            lines.append(f"  seed {s:>4}: " + (warmup_line(w) if w else "no warm-up figures"))
    lines.append("")
    lines.append("iterations until the 5-iteration running mean of training success >= 0.5 (- = never), "
                 "env steps and generated tokens per run (training rollouts):")
    for arm in arms:
        its = [results[(s, arm)]["iters_to_50pct_train"] for s in seeds]
        steps = [results[(s, arm)]["env_steps"] for s in seeds]
        toks = [results[(s, arm)]["generated_tokens"] for s in seeds]
        reached = [i for i in its if i is not None]
        lines.append(f"  {arm:5s}: per seed {' '.join(str(i) if i else '-' for i in its)}; mean over seeds that "
                     f"reached it {np.mean(reached) if reached else float('nan'):.1f} ({len(reached)}/{len(seeds)})"
                     f"; env steps {np.mean(steps):,.0f}; tokens {np.mean(toks):,.0f}")
    lines.append("")
    lines.append("anchor (step-group) statistics of the training rollouts, mean over seeds: fraction of step groups "
                 "that are singletons; fraction of rows by the size of their step group")
    lines.append(f"  {'arm':5s} {'phase':6s} {'iters':>7} {'singl.':>6} {'rows>=2':>7} "
                 + " ".join(f"{bin_label(lo, hi):>5}" for lo, hi in SIZE_BINS))
    for arm in arms:
        for phase in ("early", "middle", "late"):
            ps = [results[(s, arm)]["anchor_phases"].get(phase) for s in seeds]
            ps = [p for p in ps if p]
            if not ps:
                continue
            hist = {k: np.mean([p["row_size_hist"].get(k, 0.0) for p in ps]) for k in ps[0]["row_size_hist"]}
            sg = [p["singleton_group_fraction"] for p in ps if p["singleton_group_fraction"] is not None]
            deep = [p["deepest_level_rows_in_groups_ge2"] for p in ps
                    if "deepest_level_rows_in_groups_ge2" in p and ARMS[arm].get("step_grouping") == "hierarchical"]
            lines.append(f"  {arm:5s} {phase:6s} {ps[0]['iterations'][0]:>3}-{ps[0]['iterations'][1]:<3} "
                         f"{np.mean(sg) if sg else float('nan'):6.3f} {np.mean([p['rows_in_groups_ge2'] for p in ps]):7.3f} "
                         + " ".join(f"{v:5.3f}" for v in hist.values())
                         + (f"   deepest HGPO level: rows>=2 {np.mean(deep):.3f}" if deep else ""))
    return "\n".join(lines), gaps


def plot(results, seeds, arms, a, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install matplotlib): no plot")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = ARM_COLORS

    def band(ax, xs, ys, color, label):
        ys = np.asarray(ys, dtype=float)
        m = ys.mean(0)
        if len(ys) > 1:
            df = len(ys) - 1
            q = T975.get(df, 1.96 if df > 30 else T975[max(k for k in T975 if k <= df)])
            half = q * ys.std(0, ddof=1) / np.sqrt(len(ys))
            ax.fill_between(xs, m - half, m + half, color=color, alpha=0.18)
        ax.plot(xs, m, color=color, lw=2, label=label)

    for arm in arms:
        pts = [results[(s, arm)]["points"] for s in seeds]
        xs = [p["iteration"] for p in pts[0]]
        band(axes[0], xs, [[p["sampled"] for p in ps] for ps in pts], colors[arm], arm)
        gx = [p["iteration"] for p in pts[0] if "greedy" in p]
        if gx:  # --greedy_evals none: an empty panel
            band(axes[1], gx, [[p["greedy"] for p in ps if "greedy" in p] for ps in pts], colors[arm], arm)
        tr = [np.asarray(results[(s, arm)]["series"]["episode/success_rate"]) for s in seeds]
        n = min(map(len, tr))
        if n:
            k = min(5, n)
            sm = [np.convolve(t[:n], np.ones(k) / k, mode="valid") for t in tr]
            band(axes[2], np.arange(k, n + 1), sm, colors[arm], arm)
    name = f"corridor, {a.length} rooms" if a.env == "corridor" else f"FrozenLake {a.map_size}x{a.map_size}"
    if getattr(a, "condition", None):
        name += f", condition {a.condition}"
    if getattr(a, "model", None):
        name += f", model {a.model}"
    axes[0].set(title=f"held-out success, sampled T=1 ({name})", ylabel="success")
    greedy_when = {"schedule": "start and the last 3 evaluations", "start": "start only",
                   "none": "not evaluated"}[getattr(a, "greedy_evals", None) or "schedule"]
    axes[1].set(title=f"held-out success, greedy ({greedy_when})")
    axes[2].set(title="training success (5-iteration running mean)")
    for ax in axes:
        ax.set(xlabel="training iteration", ylim=(-0.02, 1.02))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # the greedy panel of --greedy_evals none has no curve
            ax.legend(loc="lower right")
    fig.suptitle(f"{len(seeds)} seeds: mean and 95% t band over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def write_report(a, results, seeds, warmups, total, res_dir, plot_curves=True, extra=None) -> int:
    """Print the report of ``results`` over ``seeds`` (those with every arm of ``a.arms``) and write
    ``res_dir/learning.json`` (and the plot), with the entries of ``extra`` added. Returns 0, or 1 when no seed
    has every arm."""
    if len(seeds) < len(a.seeds):
        print(f"runs finished for all arms on seeds {seeds} only (of {a.seeds}); the report covers those")
    reference_seeds = MAP_SEEDS if getattr(a, "condition", None) else HEADLINE_SEEDS
    missing_headline = [s for s in reference_seeds if s not in seeds]
    if a.testbed == "corridor" and missing_headline and not getattr(a, "model", None):
        print(f"not a {'map cell' if reference_seeds is MAP_SEEDS else 'headline'} report: seeds {missing_headline} "
              "missing")
    if not seeds:
        return 1
    warmups = {str(k): v for k, v in warmups.items()}
    table, gaps = report(results, seeds, a.arms, a, warmups)
    print()
    print(table)
    print(f"\ntotal wall time: {total:.0f}s ({a.workers} worker processes)")
    main_gap = gaps.get(f"GiGPO-GRPO/{METRICS[PRIMARY_METRIC][0]}")
    auc_gap = gaps.get("GiGPO-GRPO/AUC T=1")

    def warm_figures(s):
        w = warmups.get(str(s), {})
        return {k: w.get(k) for k in ("legal", "leads_on_among_two_legal", "n_two_door", "steps", "rules_steps",
                                      "balance_rounds", "restarts", "init_seed", "seconds", "cpu_seconds", "valid_format", "failed",
                                      "episodes", "rows", "success_rate", "sft_steps", "train_loss")
                if k in w}

    payload = {
        **provenance(),  # command, commit, date, machine
        "gap_pp": main_gap["gap_pp"] if main_gap else None,
        "ci95_pp": main_gap["ci95_pp"] if main_gap else None,
        "primary_metric": {"key": PRIMARY_METRIC, "gap": f"GiGPO-GRPO/{METRICS[PRIMARY_METRIC][0]}",
                           "description": METRICS[PRIMARY_METRIC][1], "fixed": "before the headline run"},
        "auc_gap_pp": auc_gap["gap_pp"] if auc_gap else None,
        "auc_ci95_pp": auc_gap["ci95_pp"] if auc_gap else None,
        "seeds": seeds,
        "headline_seeds": HEADLINE_SEEDS,
        "is_headline": (a.testbed == "corridor" and not missing_headline and not a.quick
                        and not getattr(a, "condition", None) and not getattr(a, "model", None)),
        "condition": getattr(a, "condition", None),
        "is_map_cell": (bool(getattr(a, "condition", None)) and not missing_headline and not a.quick
                        and not getattr(a, "model", None)),
        "model": getattr(a, "model", None),
        "headline": (f"GiGPO - GRPO held-out success on {a.testbed} (sampled T=1, mean of the last 3 evaluations, "
                     f"{len(seeds)} seeds, paired): {main_gap['gap_pp']:+.1f} pp, 95% t interval "
                     f"[{main_gap['ci95_pp'][0]:+.1f}, {main_gap['ci95_pp'][1]:+.1f}]; area under the held-out "
                     f"success curve: {auc_gap['gap_pp']:+.1f} pp [{auc_gap['ci95_pp'][0]:+.1f}, "
                     f"{auc_gap['ci95_pp'][1]:+.1f}]") if main_gap else None,
        "gaps": gaps,
        "per_seed": {str(s): {arm: {k: results[(s, arm)].get(k) for k in (
            "headline_sampled", "headline_greedy", "auc_sampled", "iters_to_50pct_train", "env_steps",
            "generated_tokens", "wall_seconds")} for arm in a.arms} | {"warmup": warm_figures(s)} for s in seeds},
        "settings": vars(a), "arms": {arm: ARMS[arm] for arm in a.arms}, "warmup": warmups,
        "total_seconds": total, "runs": [results[(s, arm)] for s in seeds for arm in a.arms], "table": table,
    } | (extra or {})
    (res_dir / "learning.json").write_text(json.dumps(payload, indent=1, default=float))
    if plot_curves:
        plot(results, seeds, a.arms, a, res_dir / "learning_curve.png")
    print(f"json: {res_dir / 'learning.json'}")
    return 0
