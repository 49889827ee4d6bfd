"""Benchmark of gigpo_trl.advantage.compute_gigpo_advantages.

Run single-threaded::

    OMP_NUM_THREADS=1 python benchmarks/bench_advantage.py

Cases:

* exact anchor matching on 16 groups x 8 trajectories x 50 turns (6,400 rows,
  ALFWorld scale) and on 10x the groups (64,000 rows); string anchors drawn
  from a small pool per task so that anchors repeat;
* fuzzy anchor matching (``similarity_threshold``) on 1,000 WebShop-length
  texts (~1,500 chars), 8 task groups of 125 rows with near-duplicates;
* HGPO (``step_grouping="hierarchical"``, the authors' recipe) on 35,200
  rows (88 groups x 8 trajectories x 50 turns, ALFWorld-like): cost of
  K = 0, 1, 2, 4 (and K = 2 with the base item) against GiGPO's estimator
  (``step_grouping="state"``) on the same rows; the contexts come from the
  anchors and the turn order;
* GraphGPO (``step_return="graph"``, the authors' recipe, both distance
  forms) on the same 35,200 rows, its next anchors the next row's anchor
  (the final observation's for a trajectory's last row);
* G2PO (``step_return="g2po"``, the authors' trainer) on the same 35,200 rows;
* the reference implementation's algorithm (:func:`reference_gigpo`) on the
  6,400 and 35,200 rows: the speed-up of ours over it.

Prints the median of several timed repeats after warm-up, and PASS/MISS
against the targets.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21, help="timed repeats per case (median reported)")
    parser.add_argument("--threshold", type=float, default=0.9, help="similarity_threshold of the fuzzy case")
    parser.add_argument("--mode", default="mean_norm", choices=["mean_norm", "mean_std_norm"])
    parser.add_argument("--reference-repeats", type=int, default=3,
                        help="timed repeats of the reference's algorithm per size (0 skips the comparison)")
    return parser


if __name__ == "__main__":
    build_parser().parse_args()  # --help and a bad flag answer before the heavy imports

from gigpo_trl.advantage import compute_gigpo_advantages  # noqa: E402
from results_io import is_default_run, write_result  # noqa: E402

TARGET_EXACT_MS = 5.0
TARGET_SCALING = 12.0
TARGET_SIMILARITY_S = 1.0
TARGET_HIERARCHY_RATIO = 3.0  # K = 2 vs the GiGPO estimator on the same rows
TARGET_REFERENCE_SPEEDUP = 50.0  # the reference's algorithm (below) over ours, same rows


def reference_gigpo(rewards, group_ids, trajectory_ids, anchor_states, action_valid, gamma=0.95, mode="mean_norm",
                    penalty=0.1, epsilon=1e-6):
    """GiGPO advantages computed the way the reference implementation (verl-agent ``gigpo/core_gigpo.py`` and
    the penalty step of its trainer) computes them, step for step, written here for timing only: returns by a
    reverse loop per trajectory (rows found by ``np.where``), put back in batch order with one ``np.where`` per
    row, the invalid-action penalty in a loop over rows, episode and step statistics as per-group lists of
    scalar tensors (``torch.mean`` / ``torch.std``), anchors grouped per task group in a dict, float32.
    Returns ``(R,)`` float32 numpy advantages."""
    import torch

    rewards = np.asarray(rewards, dtype=np.float32)
    traj = np.asarray([f"{g}/{t}" for g, t in zip(np.asarray(group_ids).tolist(), np.asarray(trajectory_ids).tolist())],
                      dtype=object)
    index = np.asarray(group_ids)
    valid = np.ones(len(rewards), dtype=bool) if action_valid is None else np.asarray(action_valid, dtype=bool)
    by_traj = {}
    for uid in np.unique(traj):  # G_t = r_t + gamma * G_{t+1}
        rows = np.where(traj == uid)[0]
        out, running = np.zeros(len(rows), dtype=np.float32), 0.0
        for t in reversed(range(len(rows))):
            running = rewards[rows][t] + gamma * running
            out[t] = running
        by_traj[uid] = out
    step_returns = np.zeros_like(rewards)
    for i, uid in enumerate(traj):
        rows = np.where(traj == uid)[0]
        step_returns[i] = by_traj[uid][np.where(rows == i)[0][0]]
    episode_reward = {uid: rewards[traj == uid].sum() for uid in np.unique(traj)}
    step_scores = torch.tensor(step_returns)
    episode_scores = torch.zeros(len(rewards))
    for i in range(len(rewards)):  # reward on the last token, minus the penalty
        episode_scores[i] = float(episode_reward[traj[i]]) - penalty * (1 - valid[i])
        step_scores[i] -= penalty * (1 - valid[i])

    def normalise(scores, ids, singleton_mean):
        id2score = {}
        for i in range(len(scores)):
            id2score.setdefault(ids[i], []).append(scores[i])
        stats = {}
        for key, vals in id2score.items():
            if len(vals) == 1:
                stats[key] = (torch.mean(torch.tensor(vals)) if singleton_mean else torch.tensor(0.0), torch.tensor(1.0))
            else:
                stats[key] = (torch.mean(torch.tensor(vals)), torch.std(torch.tensor([vals])))
        for i in range(len(scores)):
            mean, std = stats[ids[i]]
            scores[i] = scores[i] - mean if mode == "mean_norm" else (scores[i] - mean) / (std + epsilon)
        return scores

    A_E = normalise(episode_scores, index, singleton_mean=False)
    step_ids = np.empty(len(rewards), dtype=object)
    for g in np.unique(index):
        rows = np.where(index == g)[0]
        clusters = {}
        for i in rows:
            clusters.setdefault(anchor_states[i], []).append(i)
        for k, members in enumerate(clusters.values()):
            for i in members:
                step_ids[i] = f"{g}:{k}"
    A_S = normalise(step_scores, step_ids, singleton_mean=True)
    return (A_E + A_S).numpy()


def make_exact_case(n_groups: int, n_traj: int, n_turns: int, seed: int = 0):
    """Rows in trajectory-major order; anchors drawn from 30 states per task."""
    rng = np.random.default_rng(seed)
    pools = [[f"task {g}: you are in room {k}. You see a desk, a lamp and a drawer {k}." for k in range(30)]
             for g in range(n_groups)]
    R = n_groups * n_traj * n_turns
    group_ids = np.repeat(np.arange(n_groups), n_traj * n_turns)
    trajectory_ids = np.repeat(np.arange(n_groups * n_traj), n_turns)
    states = rng.integers(0, 30, size=R)
    anchors = [pools[g][s] for g, s in zip(group_ids.tolist(), states.tolist())]
    rewards = np.zeros(R)
    success = rng.random(n_groups * n_traj) < 0.4
    rewards[np.arange(n_turns - 1, R, n_turns)[success]] = 10.0
    valid = rng.random(R) > 0.05
    return dict(rewards=rewards, group_ids=group_ids, trajectory_ids=trajectory_ids,
                anchor_states=anchors, action_valid=valid)


def make_hierarchy_case(n_groups: int = 88, n_traj: int = 8, n_turns: int = 50, seed: int = 2):
    """``make_exact_case`` with anchors from a random walk over 12 rooms per task (moves of -1, 0, +1), so that
    states repeat within and across trajectories and short histories are shared (groups at every level)."""
    case = make_exact_case(n_groups, n_traj, n_turns, seed)
    rng = np.random.default_rng(seed + 1)
    steps = rng.integers(-1, 2, size=(n_groups * n_traj, n_turns))
    steps[:, 0] = 0  # every trajectory starts in room 0
    rooms = (np.cumsum(steps, axis=1) % 12).reshape(-1)
    group_ids = case["group_ids"].tolist()
    case["anchor_states"] = [f"task {g}: you are in room {k}. You see a desk and a drawer {k}."
                             for g, k in zip(group_ids, rooms.tolist())]
    return case


def next_anchors(case: dict) -> list:
    """The anchor each row's action led to: the next row's anchor in its trajectory, and for a trajectory's last
    row a final observation of its own (rows are in trajectory-major order, as ``make_exact_case`` builds them)."""
    anchors, trajs = case["anchor_states"], np.asarray(case["trajectory_ids"])
    last = np.append(trajs[1:] != trajs[:-1], True)
    return [f"trajectory {t}: the episode is over" if end else anchors[i + 1]
            for i, (t, end) in enumerate(zip(trajs.tolist(), last.tolist()))]


def make_similarity_case(n_groups: int = 8, per_group: int = 125, length: int = 1500, seed: int = 0):
    """WebShop-like pages: a shared template plus random product listings.

    Per group 40 base pages; the other rows copy a base page exactly or with a
    few character edits (a changed price / counter), i.e. near-duplicates.
    """
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
             for _ in range(800)]

    def page(g: int) -> str:
        parts = [f"WebShop [SEP] Instruction: [SEP] task {g} find a product [SEP] Back to Search [SEP] Page 1"]
        while sum(map(len, parts)) < length:
            parts.append(f"[SEP] B0{rng.randrange(10**8):08d} [SEP] "
                         + " ".join(rng.choice(vocab) for _ in range(8))
                         + f" [SEP] ${rng.randrange(5, 200)}.{rng.randrange(100):02d}")
        return " ".join(parts)[:length]

    def edit(text: str) -> str:
        chars = list(text)
        for _ in range(rng.randint(1, 12)):
            chars[rng.randrange(len(chars))] = rng.choice("0123456789")
        return "".join(chars)

    anchors, group_ids = [], []
    for g in range(n_groups):
        base = [page(g) for _ in range(40)]
        for i in range(per_group):
            b = base[i % 40] if i < 40 else base[rng.randrange(40)]
            anchors.append(b if rng.random() < 0.3 else edit(b))
            group_ids.append(g)
    R = len(anchors)
    rewards = np.array([rng.random() for _ in range(R)])
    return dict(rewards=rewards, group_ids=np.array(group_ids), trajectory_ids=np.arange(R) // 5,
                anchor_states=anchors)


def time_call(kwargs, repeats: int, warmup: int = 2) -> float:
    """Median wall seconds of one call."""
    for _ in range(warmup):
        compute_gigpo_advantages(**kwargs)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        compute_gigpo_advantages(**kwargs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_interleaved(cases: dict, repeats: int, warmup: int = 2) -> dict:
    """Median CPU seconds (``time.process_time``: single-threaded, so the wall time of a quiet machine, but not
    counting the time other jobs hold the cores) of one call per case, the cases timed in turn within each repeat
    so that load changes during the run affect all of them alike (the ratios are what this case reports)."""
    for _ in range(warmup):
        for kwargs in cases.values():
            compute_gigpo_advantages(**kwargs)
    times = {name: [] for name in cases}
    for _ in range(repeats):
        for name, kwargs in cases.items():
            t0 = time.process_time()
            compute_gigpo_advantages(**kwargs)
            times[name].append(time.process_time() - t0)
    return {name: statistics.median(values) for name, values in times.items()}


def time_cpu(fn, kwargs, repeats: int) -> float:
    """Median CPU seconds (``time.process_time``) of ``fn(**kwargs)`` after one warm-up call."""
    fn(**kwargs)
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn(**kwargs)
        times.append(time.process_time() - t0)
    return statistics.median(times)


def compare_reference(small: dict, large: dict, mode: str, ref_repeats: int, repeats: int) -> dict:
    """Speed-up of ``compute_gigpo_advantages`` over :func:`reference_gigpo` on the same rows (CPU time), and the
    largest difference of their advantages (float32 against float64). Returns the figures per number of rows."""
    figures = {}
    for case in (small, large):
        n = len(case["rewards"])
        ref = reference_gigpo(**case, mode=mode)
        ours = compute_gigpo_advantages(**case, mode=mode).advantages
        t_ref = time_cpu(reference_gigpo, dict(case, mode=mode), ref_repeats)
        t_ours = time_cpu(compute_gigpo_advantages, dict(case, mode=mode), repeats)
        speedup = t_ref / t_ours
        print(f"reference's algorithm, {n:>6} rows: {t_ref * 1e3:9.1f} ms/call, ours {t_ours * 1e3:7.2f} ms/call "
              f"= {speedup:7.0f}x   max |diff| {np.abs(ref - ours).max():.1e}"
              f"   target >= {TARGET_REFERENCE_SPEEDUP:.0f}x: {verdict(speedup >= TARGET_REFERENCE_SPEEDUP)}")
        figures[str(n)] = {"reference_ms": round(t_ref * 1e3, 1), "ours_ms": round(t_ours * 1e3, 2),
                           "speedup": round(speedup), "max_abs_diff": float(f"{np.abs(ref - ours).max():.1e}")}
    return figures


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    figures = {"targets": {"exact_6400_ms_max": TARGET_EXACT_MS, "reference_speedup_min": TARGET_REFERENCE_SPEEDUP,
                           "hgpo_k2_ratio_max": TARGET_HIERARCHY_RATIO}}

    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}  numpy {np.__version__}")
    small = make_exact_case(16, 8, 50)
    large = make_exact_case(160, 8, 50, seed=1)
    t_small = time_call(dict(small, mode=args.mode), args.repeats)
    t_large = time_call(dict(large, mode=args.mode), max(5, args.repeats // 2))
    n_small, n_large = len(small["rewards"]), len(large["rewards"])
    ratio = t_large / t_small
    print(f"exact, {n_small:>6} rows: {t_small * 1e3:8.2f} ms/call  {n_small / t_small:12,.0f} rows/s"
          f"   target <= {TARGET_EXACT_MS} ms: {verdict(t_small * 1e3 <= TARGET_EXACT_MS)}")
    print(f"exact, {n_large:>6} rows: {t_large * 1e3:8.2f} ms/call  {n_large / t_large:12,.0f} rows/s")
    figures["exact_ms"] = {str(n_small): round(t_small * 1e3, 2), str(n_large): round(t_large * 1e3, 2)}
    print(f"scaling time(10x)/time(1x) = {ratio:.2f}   target <= {TARGET_SCALING}: {verdict(ratio <= TARGET_SCALING)}")

    if args.reference_repeats > 0:
        figures["reference"] = compare_reference(small, make_hierarchy_case(), args.mode, args.reference_repeats,
                                                 args.repeats)

    hier = make_hierarchy_case()
    n_hier = len(hier["rewards"])
    cases = {"state": dict(hier, mode=args.mode)}
    for depth in (0, 1, 2, 4):
        cases[depth] = dict(hier, mode=args.mode, step_grouping="hierarchical", hierarchy_depth=depth)
    cases["2+base"] = dict(cases[2], hierarchy_base_group=True)
    graph = dict(hier, mode=args.mode, step_return="graph", next_anchor_states=next_anchors(hier), gamma=0.1)
    cases["graph"] = graph
    cases["graph, normalized"] = dict(graph, graph_normalize_distance=True)
    cases["g2po"] = dict(hier, mode=args.mode, step_return="g2po")
    times = time_interleaved(cases, args.repeats)
    t_state = times["state"]
    figures["hierarchy_rows"] = n_hier
    figures["hgpo_vs_gigpo"] = {f"K={d}": round(times[d] / t_state, 2) for d in (0, 1, 2, 4)}
    figures["graphgpo_vs_gigpo"] = round(times["graph"] / t_state, 2)
    figures["g2po_vs_gigpo"] = round(times["g2po"] / t_state, 2)
    print(f"HGPO (recipe), {n_hier} rows, CPU time: GiGPO (step_grouping='state') {t_state * 1e3:8.2f} ms/call")
    for depth in (0, 1, 2, 4, "2+base"):
        kwargs, t_k = cases[depth], times[depth]
        sizes = compute_gigpo_advantages(**kwargs).level_group_sizes
        in_groups = ", ".join(f"{(sizes[:, k] >= 2).mean():.2f}" for k in range(sizes.shape[1]))
        target = (f"   target <= {TARGET_HIERARCHY_RATIO}x: {verdict(t_k / t_state <= TARGET_HIERARCHY_RATIO)}"
                  if depth == 2 else "")
        print(f"  K={depth}: {t_k * 1e3:8.2f} ms/call = {t_k / t_state:5.2f}x GiGPO"
              f"   rows in a group of >= 2 at levels 0..K: {in_groups}{target}")
    for name in ("graph", "graph, normalized"):
        res, t_g = compute_gigpo_advantages(**cases[name]), times[name]
        reach = np.asarray(res.anchor_reaches_success).mean()
        print(f"GraphGPO (recipe, {name}): {t_g * 1e3:8.2f} ms/call = {t_g / t_state:5.2f}x GiGPO"
              f"   rows whose anchor reaches success: {reach:.2f}, largest distance {res.next_state_distances.max()}")
    print(f"G2PO (recipe): {times['g2po'] * 1e3:8.2f} ms/call = {times['g2po'] / t_state:5.2f}x GiGPO")

    sim = make_similarity_case()
    lengths = [len(s) for s in sim["anchor_states"]]
    t_sim = time_call(dict(sim, mode=args.mode, similarity_threshold=args.threshold), max(3, args.repeats // 5), 1)
    res = compute_gigpo_advantages(**sim, similarity_threshold=args.threshold)
    n_groups = len(np.unique(res.anchor_group_ids))
    print(f"similarity {args.threshold}, {len(lengths)} texts (mean {np.mean(lengths):.0f} chars, "
          f"{n_groups} step groups): {t_sim:.3f} s/call   target <= {TARGET_SIMILARITY_S} s: "
          f"{verdict(t_sim <= TARGET_SIMILARITY_S)}")
    write_result("bench_advantage", figures, recorded=is_default_run(parser, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
