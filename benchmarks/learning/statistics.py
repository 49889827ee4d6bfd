"""The learning benchmark's statistics: the 95 % t interval, paired gaps between arms, the area under the
held-out success curve, iterations to a training success level, step-group size histograms, the evaluation
schedule. numpy only."""

from __future__ import annotations

import numpy as np


# Two-sided 95% t quantiles t_{0.975, df} (scipy may be missing); df > 30 uses the normal quantile.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 25: 2.060, 30: 2.042}


def t_interval(values) -> tuple[float, float, float]:
    """(mean, lo, hi): the 95% t interval of the mean of ``values`` (nan bounds for fewer than 2 values)."""
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if x.size < 2:
        return m, float("nan"), float("nan")
    df = x.size - 1
    t = T975.get(df) or (T975[max(k for k in T975 if k <= df)] if df <= 30 else 1.960)
    half = t * float(x.std(ddof=1)) / np.sqrt(x.size)
    return m, m - half, m + half


PRIMARY_METRIC = "headline_sampled"  # fixed before any headline run; named in learning.json


METRICS = {  # key in a run's result -> (label in the gap names, description)
    "headline_sampled": ("T=1", "held-out success, sampled at T=1, mean of the last 3 evaluations"),
    "headline_greedy": ("greedy", "held-out success, greedy, mean of the last 3 evaluations"),
    "auc_sampled": ("AUC T=1", "area under the held-out success curve (sampled at T=1; trapezoid over the "
                               "evaluation points from iteration 0, divided by the iterations)"),
}


def present_metrics(runs) -> dict:
    """The entries of ``METRICS`` that every run of ``runs`` (result dicts) holds as a number: a greedy metric of
    runs made with ``--greedy_evals start`` or ``none`` is absent (None), and is left out rather than read as 0."""
    runs = list(runs)
    return {k: v for k, v in METRICS.items() if all(r.get(k) is not None for r in runs)}


def paired_gap(seeds, gaps_pp) -> dict:
    """A paired gap's entry: the per-seed gaps (pp, keyed by seed), their mean and its 95 % t interval."""
    m, lo, hi = t_interval(gaps_pp)
    return {"per_seed_pp": dict(zip(map(str, seeds), gaps_pp)), "gap_pp": m, "ci95_pp": [lo, hi]}


def gap_stats(results, seeds, a_arm, b_arm, key):
    return paired_gap(seeds, [100 * (results[(s, a_arm)][key] - results[(s, b_arm)][key]) for s in seeds])


def auc(points) -> float:
    """Area under the held-out success curve (sampled), normalised by the iterations it spans: the trapezoid rule
    over the evaluation points (iteration, success), divided by last - first iteration, so in [0, 1] (the mean
    success over training; a flat curve at s gives s). ``points``: dicts with ``iteration`` and ``sampled``."""
    pts = sorted((p["iteration"], p["sampled"]) for p in points)
    x, y = np.array([p[0] for p in pts], dtype=float), np.array([p[1] for p in pts], dtype=float)
    if len(x) < 2 or x[-1] <= x[0]:
        raise ValueError(f"auc needs evaluation points at >= 2 distinct iterations, got {list(x)}")
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2) / (x[-1] - x[0]))


def iters_to(series, level=0.5, window=5):
    """First iteration (1-based) at which the ``window``-iteration running mean of ``series`` is >= ``level``.

    Only full windows count (the first candidate is iteration ``window``): a partial window at the start is one or
    two rollouts taken before the arms differ, e.g. a first rollout that succeeds half the time by chance."""
    x = np.asarray(series, dtype=float)
    for i in range(window - 1, len(x)):
        if x[i - window + 1: i + 1].mean() >= level:
            return i + 1
    return None


SIZE_BINS = [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, None)]


def bin_label(lo, hi):
    return f"{lo}" if lo == hi else (f"{lo}-{hi}" if hi is not None else f"{lo}+")


def row_size_hist(sizes: np.ndarray) -> dict:
    """Fraction of rows whose step group has a size in each of ``SIZE_BINS``."""
    if sizes.size == 0:
        return {}
    return {bin_label(lo, hi): float(((sizes >= lo) & ((sizes <= hi) if hi else True)).mean()) for lo, hi in SIZE_BINS}


def eval_schedule(iterations: int, every: int, every_early: int) -> list[int]:
    """Iterations after which the arms are evaluated on held-out tasks (iteration 0, before training, is always
    evaluated too): the last three ``every`` apart (the headline is their mean), before them every ``every_early``
    (the AUC's coarser early points). E.g. (60, 5, 10) -> [10, 20, 30, 40, 50, 55, 60]; (30, 5, 5) ->
    [5, 10, ..., 30]. Raises ValueError when the last three would not fit after iteration 0."""
    if min(every, every_early) < 1 or iterations < 3 * every:
        raise ValueError(f"eval schedule: need eval_every >= 1, eval_every_early >= 1 and iterations >= 3 * "
                         f"eval_every, got iterations={iterations}, eval_every={every}, eval_every_early={every_early}")
    late = [iterations - 2 * every, iterations - every, iterations]
    return [it for it in range(every_early, late[0], every_early)] + late
