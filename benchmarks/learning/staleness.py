"""``--staleness_report``: learning with asynchronous rollouts against the synchronous loop, from ``--max_staleness``
runs (generation through the server stand-in, ``learning/server_standin.py``). Each runs.jsonl file holds the runs
of one ``max_staleness`` (0 among them), all with the same settings otherwise; the report pairs them by (seed, arm):

- per arm and K > 0: success at staleness K minus success at staleness 0, per seed, and its 95 % t interval;
- per K: each arm's gap to GRPO (the map's comparison) and, per K > 0, how that gap moved from staleness 0
  (the difference of the paired gaps, per seed);
- per K: how old the trained-on rollouts were (``async/staleness_mean`` / ``_max``, in optimizer steps) and the
  importance weights that corrected for it (mean, max, fraction truncated), over every iteration of every run.

Writes ``--staleness_json`` (default ``benchmarks/results/async_learning.json``) with the command, commit, date and
machine, and prints the tables. Metrics: ``statistics.METRICS`` (primary: held-out success sampled at T=1, mean of
the last 3 evaluations)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from results_io import provenance

from .runs import load_runs
from .settings import RESULTS, run_settings_filled
from .statistics import METRICS, PRIMARY_METRIC, gap_stats, paired_gap, present_metrics

SERIES = {"staleness_mean": "async/staleness_mean", "staleness_max": "async/staleness_max",
          "is_ratio_mean": "sampling/importance_sampling_ratio/mean", "is_ratio_max": "sampling/importance_sampling_ratio/max",
          "is_truncated_fraction": "sampling/importance_sampling_ratio/truncated_fraction",
          "groups_dropped": "async/groups_dropped"}


def runs_by_staleness(paths) -> dict[int, dict]:
    """{max_staleness: {(seed, arm): run}} from runs.jsonl files of one ``max_staleness`` each. Raises ValueError
    naming the file for a file that mixes values or has runs without the server stand-in (``max_staleness`` None),
    for two files of one value, and for runs whose other settings differ; and when staleness 0 is missing."""
    by_k: dict[int, dict] = {}
    settings = {}
    for path in paths:
        results = load_runs([path])
        ks = {r["run_settings"].get("max_staleness") for r in results.values()}
        if len(ks) != 1 or None in ks:
            raise ValueError(f"{path}: expected the runs of one --max_staleness, got max_staleness {sorted(ks, key=str)}")
        k = ks.pop()
        if k in by_k:
            raise ValueError(f"{path}: a second file of max_staleness {k}")
        by_k[k] = results
        filled = run_settings_filled(next(iter(results.values()))["run_settings"]) | {"max_staleness": None}
        settings[json.dumps(filled, sort_keys=True)] = path
    if len(settings) > 1:
        raise ValueError("the files' runs differ in settings other than max_staleness: " + ", ".join(map(str, paths)))
    if 0 not in by_k or len(by_k) < 2:
        raise ValueError(f"need the runs of max_staleness 0 and of at least one K > 0, got {sorted(by_k)}")
    return by_k


def series_summary(results: dict) -> dict:
    """Mean (``_max``: the most) over every training iteration of every run of each ``SERIES`` metric; None when
    no run logged it (staleness 0 logs no ``async/`` metric)."""
    out = {}
    for name, key in SERIES.items():
        values = [v for r in results.values() for v in r["series"].get(key, [])]
        out[name] = None if not values else float(np.max(values) if name.endswith("_max") else np.mean(values))
    return out


def staleness_figures(by_k: dict[int, dict]) -> dict:
    """The report's figures (see the module doc) over the seeds and arms present at every staleness."""
    seeds = sorted(set.intersection(*({s for s, _ in r} for r in by_k.values())))
    arms = sorted(set.intersection(*({a for _, a in r} for r in by_k.values())))
    base = by_k[0]
    # the metrics every run holds (greedy is absent from --greedy_evals start / none runs)
    metrics = present_metrics(r[(s, a)] for r in by_k.values() for s in seeds for a in arms)
    figures: dict = {"seeds": seeds, "arms": arms, "staleness": sorted(by_k), "primary_metric": PRIMARY_METRIC,
                     "per_staleness": {}, "staleness_vs_sync": {}, "gap_to_grpo_moved": {}}
    for k, results in sorted(by_k.items()):
        entry = {"mean": {arm: {m: float(np.mean([results[(s, arm)][m] for s in seeds])) for m in metrics}
                          for arm in arms},
                 "gap_to_grpo": {f"{arm}-GRPO/{label}": gap_stats(results, seeds, arm, "GRPO", m)
                                 for arm in arms if arm != "GRPO" and "GRPO" in arms
                                 for m, (label, _) in metrics.items()},
                 "cpu_seconds_per_run": float(np.mean([results[(s, a)]["cpu_seconds"] for s in seeds for a in arms])),
                 **series_summary({key: r for key, r in results.items() if key[0] in seeds and key[1] in arms})}
        figures["per_staleness"][str(k)] = entry
        if k == 0:
            continue
        for arm in arms:
            for m, (label, _) in metrics.items():
                figures["staleness_vs_sync"][f"{arm}/{k}-0/{label}"] = paired_gap(
                    seeds, [100 * (results[(s, arm)][m] - base[(s, arm)][m]) for s in seeds])
        for arm in arms:
            if arm == "GRPO" or "GRPO" not in arms:
                continue
            for m, (label, _) in metrics.items():
                figures["gap_to_grpo_moved"][f"{arm}-GRPO/{k}-0/{label}"] = paired_gap(
                    seeds, [100 * ((results[(s, arm)][m] - results[(s, "GRPO")][m])
                                   - (base[(s, arm)][m] - base[(s, "GRPO")][m])) for s in seeds])
    return figures


def _pp(g: dict) -> str:
    lo, hi = g["ci95_pp"]
    return f"{g['gap_pp']:+6.1f} [{lo:+6.1f}, {hi:+6.1f}]"


def staleness_table(figures: dict) -> str:
    """The figures as text: means per staleness and arm, then the paired gaps (pp, 95 % interval)."""
    lines = [f"seeds {figures['seeds']}; success in % (primary: {METRICS[PRIMARY_METRIC][0]})"]
    for k, entry in figures["per_staleness"].items():
        means = ", ".join(f"{arm} {100 * v[PRIMARY_METRIC]:.1f} / greedy "
                          + (f"{100 * v['headline_greedy']:.1f}" if "headline_greedy" in v else "-")
                          for arm, v in entry["mean"].items())
        age = "" if entry["staleness_mean"] is None else (
            f"; rollouts {entry['staleness_mean']:.2f} steps old on average (at most {entry['staleness_max']:.0f}), "
            f"IS weight mean {entry['is_ratio_mean']:.3f} max {entry['is_ratio_max']:.3f}, truncated "
            f"{100 * entry['is_truncated_fraction']:.1f} %")
        lines.append(f"max_staleness {k}: {means}; {entry['cpu_seconds_per_run']:.0f} CPU s per run{age}")
        for name, g in entry["gap_to_grpo"].items():
            lines.append(f"  {name:<22} {_pp(g)}")
    for title, key in (("staleness K - staleness 0, same seed and arm", "staleness_vs_sync"),
                       ("gap to GRPO at staleness K - at staleness 0, same seed", "gap_to_grpo_moved")):
        lines.append(title + ":")
        lines += [f"  {name:<28} {_pp(g)}" for name, g in figures[key].items()]
    return "\n".join(lines)


def staleness_report(paths, out_path=None) -> int:
    """Print and write the report of ``paths`` (runs.jsonl files); returns 0."""
    figures = staleness_figures(runs_by_staleness(paths))
    table = staleness_table(figures)
    print(table)
    out_path = Path(out_path or RESULTS / "async_learning.json")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps({"benchmark": "async_learning", **provenance(),
                                    "figures": figures | {"table": table}}, indent=1, default=float))
    print(f"json: {out_path}")
    return 0
