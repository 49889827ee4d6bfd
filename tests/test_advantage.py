"""Tests of gigpo_trl.advantage (GiGPO episode- and step-level advantages)."""

from __future__ import annotations

import math
import pickle
import random
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gigpo_trl.advantage import (AdvantageResult, EstimatorSettings, anchor_digest, compute_gigpo_advantages,
                                 returns_to_go)

TOL = 1e-5


def _rows(spec):
    """spec: {(group, traj): [(anchor, reward), ...]} -> list of row tuples."""
    return [(g, t, a, r) for (g, t), steps in spec.items() for a, r in steps]


def _run(rows, **kw):
    g, t, a, r = (list(c) for c in zip(*rows))
    return compute_gigpo_advantages(rewards=r, group_ids=g, trajectory_ids=t, anchor_states=a, **kw)


def _same_partition(x, y):
    x, y = np.asarray(x), np.asarray(y)
    return np.array_equal(x[:, None] == x[None, :], y[:, None] == y[None, :])


# --------------------------------------------------------------------------
# reference case (γ = 0.95, ω = 1, mean_norm, all valid)
# --------------------------------------------------------------------------

REFERENCE = {
    ("g0", "t0"): [("s0", 0), ("s1", 0), ("s2", 1)],
    ("g0", "t1"): [("s0", 0), ("s1", 0), ("s3", 0), ("s4", 0)],
    ("g0", "t2"): [("s0", 0), ("s3", 0), ("s2", 1)],
    ("g1", "t0"): [("s0", 0), ("s1", 1)],
    ("g1", "t1"): [("s0", 0), ("s0", 0), ("s1", 0), ("s2", 0)],
    ("g1", "t2"): [("s0", 0), ("s2", 0), ("s1", 1)],
}
# (episode, step, total) per row, in the order of REFERENCE
REFERENCE_EXPECTED = [
    (0.4, 0.300833, 0.700833), (0.4, 0.475, 0.875), (0.4, 0.0, 0.4),
    (-0.6, -0.601667, -1.201667), (-0.6, -0.475, -1.075), (-0.6, -0.475, -1.075), (-0.6, 0.0, -0.6),
    (0.4, 0.300833, 0.700833), (0.4, 0.475, 0.875), (0.4, 0.0, 0.4),
    (0.444444, 0.486875, 0.931319), (0.444444, 0.333333, 0.777778),
    (-0.555556, -0.463125, -1.018681), (-0.555556, -0.463125, -1.018681),
    (-0.555556, -0.666667, -1.222222), (-0.555556, -0.475, -1.030556),
    (0.444444, 0.439375, 0.883819), (0.444444, 0.475, 0.919444), (0.444444, 0.333333, 0.777778),
]


def _check_reference(res, order):
    exp = np.array(REFERENCE_EXPECTED)[order]
    np.testing.assert_allclose(res.episode_advantages, exp[:, 0], atol=TOL)
    np.testing.assert_allclose(res.step_advantages, exp[:, 1], atol=TOL)
    np.testing.assert_allclose(res.advantages, exp[:, 2], atol=TOL)


def test_reference_case_listed_order():
    res = _run(_rows(REFERENCE), gamma=0.95, step_advantage_weight=1.0, mode="mean_norm")
    assert isinstance(res, AdvantageResult)
    _check_reference(res, np.arange(19))
    # G_t of g0/t0: 0.95^2, 0.95, 1
    np.testing.assert_allclose(res.step_returns[:3], [0.9025, 0.95, 1.0], atol=1e-12)
    np.testing.assert_allclose(res.episode_returns[:3], [1, 1, 1])
    np.testing.assert_allclose(res.episode_returns[3:7], [0, 0, 0, 0])
    # g0 s0 has 3 rows; g1 s0 has 4 rows; g0 s4 is alone
    assert res.anchor_group_sizes[0] == 3 and res.anchor_group_sizes[10] == 4 and res.anchor_group_sizes[6] == 1
    # s0 of g0 and s0 of g1 are different step groups
    assert res.anchor_group_ids[0] != res.anchor_group_ids[10]
    assert res.anchor_group_ids[0] == res.anchor_group_ids[3] == res.anchor_group_ids[7]


def test_reference_case_shuffled_interleaved_order():
    rows = _rows(REFERENCE)
    # random interleaving that keeps each trajectory's rows in turn order
    rng = random.Random(7)
    queues = {}
    for i, (g, t, _, _) in enumerate(rows):
        queues.setdefault((g, t), []).append(i)
    order = []
    while queues:
        key = rng.choice(sorted(queues))
        order.append(queues[key].pop(0))
        if not queues[key]:
            del queues[key]
    assert order != sorted(order)
    res = _run([rows[i] for i in order])
    _check_reference(res, np.array(order))


# --------------------------------------------------------------------------
# hand-computed cases
# --------------------------------------------------------------------------


def test_mean_std_norm_hand_computed():
    # one group, γ = 0.5; tA: [x r=1, y r=2] (R=3), tB: [x r=0, z r=0] (R=0),
    # tC: [x r=3] (R=3).
    # Episode, rows: scores 3,3,0,0,3 -> mean 1.8, var = (3*1.44 + 2*3.24)/4
    #   = (4.32 + 6.48)/4 = 2.7, std = 1.643168; A_E = 1.2/std = 0.730297,
    #   -1.8/std = -1.095445 (std + 1e-6 in the denominator).
    # G: tA: [1 + 0.5*2, 2] = [2, 2]; tB: [0, 0]; tC: [3].
    # Step group x: G = 2, 0, 3 -> mean 5/3, var = ((1/3)^2 + (5/3)^2 + (4/3)^2)/2
    #   = (1 + 25 + 16)/18 = 7/3, std = 1.527525;
    #   A_S = (1/3)/std = 0.218218, (-5/3)/std = -1.091089, (4/3)/std = 0.872872.
    # y and z are alone: A_S = 0.
    rows = [("g", "A", "x", 1.0), ("g", "A", "y", 2.0), ("g", "B", "x", 0.0), ("g", "B", "z", 0.0),
            ("g", "C", "x", 3.0)]
    res = _run(rows, gamma=0.5, mode="mean_std_norm", step_advantage_weight=0.5)
    std_e = math.sqrt(2.7) + 1e-6
    std_s = math.sqrt(7 / 3) + 1e-6
    exp_e = np.array([1.2, 1.2, -1.8, -1.8, 1.2]) / std_e
    exp_s = np.array([1 / 3 / std_s, 0.0, -5 / 3 / std_s, 0.0, 4 / 3 / std_s])
    np.testing.assert_allclose(exp_e[[0, 2]], [0.730297, -1.095445], atol=TOL)
    np.testing.assert_allclose(exp_s[[0, 2, 4]], [0.218218, -1.091089, 0.872872], atol=TOL)
    np.testing.assert_allclose(res.episode_advantages, exp_e, atol=1e-9)
    np.testing.assert_allclose(res.step_advantages, exp_s, atol=1e-9)
    np.testing.assert_allclose(res.advantages, exp_e + 0.5 * exp_s, atol=1e-9)
    np.testing.assert_allclose(res.step_returns, [2, 2, 0, 0, 3], atol=1e-12)


def test_invalid_action_penalty_hand_computed():
    # γ = 1, penalty 0.1, mean_norm. tA: [s r=0 invalid, u r=1] R=1; tB: [s r=0, u r=0] R=0.
    # Episode scores: tA row0 1 - 0.1 = 0.9, row1 1; tB 0, 0 -> mean 1.9/4 = 0.475;
    #   A_E = 0.425, 0.525, -0.475, -0.475.
    # G raw: tA [1, 1], tB [0, 0]; minus own penalty: tA row0 0.9.
    # Step s: 0.9, 0 -> mean 0.45 -> +0.45, -0.45; step u: 1, 0 -> +0.5, -0.5.
    rows = [("g", "A", "s", 0.0), ("g", "A", "u", 1.0), ("g", "B", "s", 0.0), ("g", "B", "u", 0.0)]
    res = _run(rows, gamma=1.0, action_valid=[False, True, True, True], invalid_action_penalty=0.1)
    np.testing.assert_allclose(res.episode_advantages, [0.425, 0.525, -0.475, -0.475], atol=1e-12)
    np.testing.assert_allclose(res.step_returns, [0.9, 1.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(res.step_advantages, [0.45, 0.5, -0.45, -0.5], atol=1e-12)
    np.testing.assert_allclose(res.advantages, [0.875, 1.025, -0.925, -0.975], atol=1e-12)
    np.testing.assert_allclose(res.episode_returns, [1, 1, 0, 0])


def test_episode_stats_trajectories_vs_rows():
    # tA: 1 row, R=1; tB: 3 rows, R=0. Distinct anchors.
    # trajectories: population {1, 0} -> mean 0.5 -> A_E = 0.5 (tA), -0.5 (tB).
    #   mean_std_norm: std = sqrt(0.5) = 0.707107 -> 0.5/0.707108 = 0.707106.
    # rows: population {1, 0, 0, 0} -> mean 0.25 -> A_E = 0.75, -0.25.
    # With tB row1 invalid (penalty 0.2), trajectories mode keeps mean 0.5
    #   (unpenalised R_tau) and that row gets -0.2 - 0.5 = -0.7.
    rows = [("g", "A", "a", 1.0), ("g", "B", "b", 0.0), ("g", "B", "c", 0.0), ("g", "B", "d", 0.0)]
    traj = _run(rows, episode_stats="trajectories")
    np.testing.assert_allclose(traj.episode_advantages, [0.5, -0.5, -0.5, -0.5], atol=1e-12)
    per_row = _run(rows, episode_stats="rows")
    np.testing.assert_allclose(per_row.episode_advantages, [0.75, -0.25, -0.25, -0.25], atol=1e-12)
    std = _run(rows, episode_stats="trajectories", mode="mean_std_norm")
    np.testing.assert_allclose(std.episode_advantages, np.array([0.5, -0.5, -0.5, -0.5]) / (math.sqrt(0.5) + 1e-6),
                               atol=1e-12)
    np.testing.assert_allclose(std.episode_advantages[0], 0.707106, atol=TOL)
    pen = _run(rows, episode_stats="trajectories", action_valid=[1, 0, 1, 1], invalid_action_penalty=0.2)
    np.testing.assert_allclose(pen.episode_advantages, [0.5, -0.7, -0.5, -0.5], atol=1e-12)


def test_singleton_groups():
    # A task group of one trajectory (here one row): A_E = A_S = 0, in both modes (not the raw return 2.5).
    for mode in ("mean_norm", "mean_std_norm"):
        res = _run([("g", "t", "s", 2.5)], mode=mode)
        np.testing.assert_array_equal(res.episode_advantages, [0.0])
        np.testing.assert_array_equal(res.step_advantages, [0.0])
        np.testing.assert_array_equal(res.episode_returns, [2.5])
    # all-equal group -> exactly 0
    rows = [("g", i, "s", 0.1) for i in range(3)]
    res = _run(rows, mode="mean_std_norm")
    assert np.all(res.episode_advantages == 0.0) and np.all(res.step_advantages == 0.0)


@pytest.mark.parametrize("episode_stats", ["rows", "trajectories"])
def test_lone_surviving_trajectory_gets_zero_advantage(episode_stats):
    # Group "w": the only healthy member (the others failed and were dropped) wins a WebShop-like 10 after 3 turns,
    # revisiting state "a" and with one invalid action. Group "h": two healthy members, computed as usual.
    rows = [("w", 0, "a", 0.0), ("w", 0, "b", 0.0), ("w", 0, "a", 10.0),
            ("h", 0, "s", 1.0), ("h", 1, "s", 0.0)]
    res = _run(rows, action_valid=[1, 0, 1, 1, 1], episode_stats=episode_stats)
    np.testing.assert_array_equal(res.episode_advantages[:3], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(res.step_advantages[:3], [0.0, 0.0, 0.0])  # "a" twice: still no comparison
    np.testing.assert_array_equal(res.advantages[:3], [0.0, 0.0, 0.0])
    assert res.anchor_group_sizes[0] == 2  # the step group itself is still reported
    # the healthy pair: R = 1 vs 0, mean 0.5 -> A_E = ±0.5, one shared anchor -> A_S = ±0.5
    np.testing.assert_allclose(res.episode_advantages[3:], [0.5, -0.5], atol=1e-12)
    np.testing.assert_allclose(res.step_advantages[3:], [0.5, -0.5], atol=1e-12)


def test_long_trajectory_returns_are_exact():
    # 300 turns, reward 1 at the last turn only: G_t = γ^(299 - t); also γ = 0 and a small γ.
    T = 300
    r = np.zeros(T)
    r[-1] = 1.0
    for gamma in (0.95, 0.3, 0.0, 1.0):
        res = compute_gigpo_advantages(rewards=r, group_ids=np.zeros(T, int), trajectory_ids=np.zeros(T, int),
                                       anchor_states=np.arange(T), gamma=gamma)
        expected = np.array([gamma ** (T - 1 - t) for t in range(T)])
        np.testing.assert_allclose(res.step_returns, expected, rtol=1e-12, atol=0)


# --------------------------------------------------------------------------
# similarity threshold
# --------------------------------------------------------------------------

BASE = "You are on the product page of a red cotton t-shirt, size M, price $12.99. Options: buy now, back."


def test_similarity_merges_near_duplicates_only():
    near = BASE.replace("$12.99", "$12.98")
    other = "Search results page 2: blue jeans, black boots, wool socks. Next page."
    rows = [("g", "A", BASE, 1.0), ("g", "B", near, 0.0), ("g", "C", other, 0.0)]
    exact = _run(rows)
    assert len(set(exact.anchor_group_ids.tolist())) == 3
    res = _run(rows, similarity_threshold=0.9)
    ids = res.anchor_group_ids
    assert ids[0] == ids[1] != ids[2]
    np.testing.assert_array_equal(res.anchor_group_sizes, [2, 2, 1])
    # step group {1, 0}: mean 0.5 -> +0.5, -0.5; "other" alone -> 0
    np.testing.assert_allclose(res.step_advantages, [0.5, -0.5, 0.0], atol=1e-12)
    # never across task groups
    res2 = _run([("g", "A", BASE, 1.0), ("h", "B", BASE, 0.0)], similarity_threshold=0.9)
    assert res2.anchor_group_ids[0] != res2.anchor_group_ids[1]


def test_similarity_chain_is_transitive_and_order_independent():
    # "similar" = rapidfuzz.fuzz.ratio/100 >= threshold, transitive closure within a task group.
    # A = 20 'a'; B = 20 'a' + 4 'b'; C = 20 'a' + 8 'b'.
    # sim(A,B) = 1 - 4/44 = 0.909, sim(B,C) = 1 - 4/52 = 0.923, sim(A,C) = 1 - 8/48 = 0.833.
    # threshold 0.9: A~B, B~C, A!~C -> all three in one step group.
    A, B, C = "a" * 20, "a" * 20 + "b" * 4, "a" * 20 + "b" * 8
    D = "xyz" * 10
    rows = [("g", "t0", A, 1.0), ("g", "t1", B, 0.0), ("g", "t2", C, 0.0), ("g", "t3", D, 1.0)]
    res = _run(rows, similarity_threshold=0.9)
    assert len(set(res.anchor_group_ids[:3].tolist())) == 1 and res.anchor_group_ids[3] != res.anchor_group_ids[0]
    # G = reward (one-row trajectories): group {1, 0, 0}: mean 1/3
    np.testing.assert_allclose(res.step_advantages, [2 / 3, -1 / 3, -1 / 3, 0.0], atol=1e-12)
    # threshold 0.92: only B~C
    res92 = _run(rows, similarity_threshold=0.92)
    ids = res92.anchor_group_ids
    assert ids[1] == ids[2] and len({ids[0], ids[1], ids[3]}) == 3
    # every permutation of the rows gives the same grouping and values
    rng = random.Random(0)
    for _ in range(6):
        perm = list(range(4))
        rng.shuffle(perm)
        out = _run([rows[i] for i in perm], similarity_threshold=0.9)
        assert _same_partition(out.anchor_group_ids, res.anchor_group_ids[perm])
        np.testing.assert_allclose(out.advantages, res.advantages[perm], atol=1e-12)


def test_similarity_many_texts_matches_bruteforce():
    # random mutations of a few bases; compare with an O(n^2) union-find over all pairs
    from rapidfuzz import fuzz

    rng = random.Random(3)
    bases = ["".join(rng.choice("abcdefgh ") for _ in range(200)) for _ in range(4)]
    texts = []
    for i in range(40):
        chars = list(bases[i % 4])
        for _ in range(rng.randint(0, 30)):
            chars[rng.randrange(200)] = rng.choice("abcdefgh ")
        texts.append("".join(chars))
    groups = [i % 2 for i in range(40)]
    res = compute_gigpo_advantages(rewards=np.arange(40.0), group_ids=groups, trajectory_ids=list(range(40)),
                                   anchor_states=texts, similarity_threshold=0.88)
    parent = list(range(40))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(40):
        for j in range(i + 1, 40):
            if groups[i] == groups[j] and fuzz.ratio(texts[i], texts[j]) / 100 >= 0.88:
                parent[find(i)] = find(j)
    assert _same_partition(res.anchor_group_ids, [find(i) for i in range(40)])
    assert len(set(res.anchor_group_ids.tolist())) < 40  # some merges happened


# --------------------------------------------------------------------------
# anchor types
# --------------------------------------------------------------------------


def test_anchor_types():
    anchors = [
        "s", "s",                                   # str
        7, 7,                                       # int
        (1, "a"), (1, "a"),                         # tuple
        np.arange(4), np.arange(4),                 # equal arrays group
        np.arange(4).reshape(2, 2),                 # same values, different shape: alone
        {"x": 1, "y": [1, 2]}, {"y": [1, 2], "x": 1},  # dict, key order irrelevant
        {"x": 2, "y": [1, 2]},                      # different dict: alone
    ]
    n = len(anchors)
    res = compute_gigpo_advantages(rewards=np.arange(n, dtype=float), group_ids=[0] * n,
                                   trajectory_ids=list(range(n)), anchor_states=anchors)
    ids = res.anchor_group_ids.tolist()
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[4] == ids[5] and ids[6] == ids[7] and ids[9] == ids[10]
    assert len(set(ids)) == 7  # s, 7, (1, "a"), arange(4), 2x2 array, dict1, dict2
    np.testing.assert_array_equal(res.anchor_group_sizes, [2, 2, 2, 2, 2, 2, 2, 2, 1, 2, 2, 1])
    # one-row trajectories: G = r; pairs (2k, 2k+1) -> -0.5, +0.5
    np.testing.assert_allclose(res.step_advantages[:8], [-0.5, 0.5] * 4, atol=1e-12)
    np.testing.assert_allclose(res.step_advantages[[8, 11]], [0.0, 0.0])
    np.testing.assert_allclose(res.step_advantages[9:11], [-0.5, 0.5], atol=1e-12)


def test_anchor_equality_is_by_value_nan_and_signed_zero():
    # Each pair is one state: NaN objects that are not identical (as after pickling to/from an env worker), NaN
    # inside tuples, dicts and arrays (any payload or sign), -0.0 vs 0.0 inside arrays and lists; then a different
    # state (1.0 vs nan) that must stay apart.
    nan_a, nan_b = float("nan"), pickle.loads(pickle.dumps(float("nan")))
    assert nan_a is not nan_b
    pairs = [
        (nan_a, nan_b),
        ((1, nan_a), (1, nan_b)),
        ({"x": nan_a}, {"x": nan_b}),
        (np.array([0.0, np.nan]), np.array([-0.0, -np.nan])),
        (np.array([1 + 0j, complex(np.nan, 2)]), np.array([1 - 0j, complex(-np.nan, 2)])),
        ([-0.0, "a"], [0.0, "a"]),
        (torch.tensor([-0.0, float("nan")]), torch.tensor([0.0, float("nan")])),
        (np.float32("nan"), math.nan),
    ]
    anchors = [a for pair in pairs for a in pair] + [(1, 1.0)]
    n = len(anchors)
    res = compute_gigpo_advantages(rewards=np.arange(n, dtype=float), group_ids=[0] * n,
                                   trajectory_ids=list(range(n)), anchor_states=anchors)
    ids = res.anchor_group_ids.tolist()
    assert all(ids[2 * k] == ids[2 * k + 1] for k in range(len(pairs))), ids
    assert len(set(ids)) == len(pairs) - 1 + 1  # NaN scalars of both kinds are one state; (1, 1.0) alone
    # one-row trajectories, G = r: a pair -> -0.5, +0.5; the four NaN scalars (rewards 0, 1, 14, 15) -> r - 7.5;
    # the lone (1, 1.0) -> 0
    np.testing.assert_allclose(res.step_advantages[2:4], [-0.5, 0.5], atol=1e-12)
    np.testing.assert_allclose(res.step_advantages[[0, 1, 14, 15]], [-7.5, -6.5, 6.5, 7.5], atol=1e-12)
    assert res.step_advantages[-1] == 0.0
    # the array fast paths: (R, d) float rows and a 1-D float array
    rows = np.array([[0.0, np.nan], [-0.0, -np.nan], [0.0, 1.0]])
    ids = compute_gigpo_advantages(rewards=np.zeros(3), group_ids=[0] * 3, trajectory_ids=[0, 1, 2],
                                   anchor_states=rows).anchor_group_ids
    assert ids[0] == ids[1] != ids[2]
    for anchors in (np.array([np.nan, -np.nan, -0.0, 0.0]), [nan_a, nan_b, -0.0, 0.0]):
        ids = compute_gigpo_advantages(rewards=np.zeros(4), group_ids=[0] * 4, trajectory_ids=[0, 1, 2, 3],
                                       anchor_states=anchors).anchor_group_ids
        assert ids[0] == ids[1] != ids[2] == ids[3]


def test_anchor_digest_matches_the_estimator_where_the_repr_hash_did_not():
    # Pairs the estimator groups (dict key order, -0.0 vs 0.0, 1 vs 1.0, NaN objects, sets), on which the records'
    # former repr hash disagreed with it; then pairs that must stay apart.
    same = [
        ({"x": 1, "y": "a"}, {"y": "a", "x": 1}),
        (-0.0, 0.0),
        ((1, -0.0), (1.0, 0.0)),
        ({"k": [-0.0]}, {"k": [0.0]}),
        (float("nan"), pickle.loads(pickle.dumps(float("nan")))),
        ({"b", "a", "c"}, {"c", "a", "b"}),
        (np.array([-0.0, 1.0]), np.array([0.0, 1.0])),
    ]
    apart = [("1", 1), ((1,), [1]), (b"a", "a"), (np.arange(4), np.arange(4).reshape(2, 2)), ({"x": 1}, {"x": 2})]
    for a, b in same:
        assert anchor_digest(a) == anchor_digest(b), (a, b)
    assert repr({"x": 1, "y": "a"}) != repr({"y": "a", "x": 1}) and repr(-0.0) != repr(0.0)  # the former keys
    for a, b in apart:
        assert anchor_digest(a) != anchor_digest(b), (a, b)
    assert anchor_digest(None) is None and len(anchor_digest("s")) == 16
    # the estimator groups the raw anchors exactly as their digests do
    anchors = [x for pair in same + apart for x in pair]
    n = len(anchors)
    raw = compute_gigpo_advantages(rewards=np.zeros(n), group_ids=[0] * n, trajectory_ids=list(range(n)),
                                   anchor_states=anchors).anchor_group_ids
    digests = compute_gigpo_advantages(rewards=np.zeros(n), group_ids=[0] * n, trajectory_ids=list(range(n)),
                                       anchor_states=[anchor_digest(a) for a in anchors]).anchor_group_ids
    assert _same_partition(raw, digests)


def test_anchor_digest_is_the_same_in_another_process():
    # sets and dicts hash their str members with a per-process seed: the digest must not depend on it
    import subprocess
    import sys

    code = ("from gigpo_trl.advantage import anchor_digest; "
            "print(anchor_digest({'k': {'a', 'b', 'c', 'd'}, 'z': ('x', -0.0)}))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout.strip()
            for seed in ("1", "2")}
    assert outs == {anchor_digest({"z": ("x", 0.0), "k": {"d", "c", "b", "a"}})}


def test_returns_to_go_hand_computed():
    # trajectories a: r = 0, 0, 1 and b: r = 1, 2 interleaved; gamma 0.5: a -> 0.25, 0.5, 1; b -> 2, 2
    g = returns_to_go([0.0, 1.0, 0.0, 2.0, 1.0], ["a", "b", "a", "b", "a"], 0.5)
    np.testing.assert_allclose(g, [0.25, 2.0, 0.5, 2.0, 1.0])


def test_settings_value_equals_keywords_and_round_trips():
    settings = EstimatorSettings(gamma=0.5, mode="mean_std_norm", invalid_action_penalty=0.2)
    rows = _rows(REFERENCE)
    g, t, a, r = (list(c) for c in zip(*rows))
    by_value = compute_gigpo_advantages(r, g, t, a, None, settings)
    by_keywords = compute_gigpo_advantages(r, g, t, a, gamma=0.5, mode="mean_std_norm", invalid_action_penalty=0.2)
    np.testing.assert_array_equal(by_value.advantages, by_keywords.advantages)
    # a keyword overrides the value's setting
    np.testing.assert_array_equal(compute_gigpo_advantages(r, g, t, a, settings=settings, gamma=0.95).advantages,
                                  compute_gigpo_advantages(r, g, t, a, mode="mean_std_norm",
                                                           invalid_action_penalty=0.2).advantages)
    import json

    assert EstimatorSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings
    assert EstimatorSettings.from_dict({"gamma": 0.5}) == EstimatorSettings(gamma=0.5)  # missing: the default
    with pytest.raises(TypeError, match="unknown estimator setting.*'gama'"):
        EstimatorSettings.from_dict({"gama": 0.5})
    with pytest.raises(TypeError, match="unknown estimator setting.*'gama'"):
        compute_gigpo_advantages(r, g, t, a, gama=0.5)
    with pytest.raises(ValueError, match="gamma must be finite and in"):
        settings.replace(gamma=2.0)
    assert EstimatorSettings(gamma=1, hierarchy_depth=np.int64(3)).gamma == 1.0


def test_anchor_2d_array_rows():
    obs = np.array([[0, 1], [0, 1], [1, 0]])
    res = compute_gigpo_advantages(rewards=[1.0, 0.0, 0.0], group_ids=[0, 0, 0], trajectory_ids=[0, 1, 2],
                                   anchor_states=obs)
    np.testing.assert_allclose(res.step_advantages, [0.5, -0.5, 0.0], atol=1e-12)


# --------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------


def test_torch_matches_numpy():
    rows = _rows(REFERENCE)
    g, t, a, r = (list(c) for c in zip(*rows))
    ref = compute_gigpo_advantages(rewards=np.array(r, float), group_ids=g, trajectory_ids=t, anchor_states=a,
                                   mode="mean_std_norm")
    for dtype in (torch.float32, torch.float64):
        out = compute_gigpo_advantages(rewards=torch.tensor(r, dtype=dtype), group_ids=g, trajectory_ids=t,
                                       anchor_states=a, action_valid=torch.ones(len(r), dtype=torch.bool),
                                       mode="mean_std_norm")
        for name in ("episode_advantages", "step_advantages", "advantages", "step_returns", "episode_returns"):
            v = getattr(out, name)
            assert isinstance(v, torch.Tensor) and v.dtype == dtype and v.device.type == "cpu"
            np.testing.assert_allclose(v.numpy(), getattr(ref, name), atol=1e-6)
        assert isinstance(out.anchor_group_ids, torch.Tensor)
        np.testing.assert_array_equal(out.anchor_group_ids.numpy(), ref.anchor_group_ids)
    assert isinstance(ref.advantages, np.ndarray) and ref.advantages.dtype == np.float64


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------

GOOD = dict(rewards=[1.0, 0.0], group_ids=[0, 0], trajectory_ids=[0, 1], anchor_states=["a", "a"])


class _NoHash:
    __hash__ = None


@pytest.mark.parametrize(
    "change, exc, match",
    [
        (dict(group_ids=[0]), ValueError, "group_ids"),
        (dict(trajectory_ids=[0, 1, 2]), ValueError, "trajectory_ids"),
        (dict(anchor_states=["a"]), ValueError, "anchor_states"),
        (dict(action_valid=[True]), ValueError, "action_valid"),
        (dict(rewards=[1.0, float("nan")]), ValueError, "rewards"),
        (dict(rewards=[float("inf"), 0.0]), ValueError, "rewards"),
        (dict(mode="zscore"), ValueError, "mode"),
        (dict(episode_stats="tokens"), ValueError, "episode_stats"),
        (dict(similarity_threshold=0.0), ValueError, "similarity_threshold"),
        (dict(similarity_threshold=1.0), ValueError, "similarity_threshold"),
        (dict(similarity_threshold=1.5), ValueError, "similarity_threshold"),
        (dict(gamma=1.01), ValueError, "gamma"),
        (dict(gamma=-0.1), ValueError, "gamma"),
        (dict(gamma=float("nan")), ValueError, "gamma"),
        (dict(anchor_states=[_NoHash(), _NoHash()]), TypeError, "anchor_states"),
        (dict(anchor_states=[[_NoHash()], "a"]), TypeError, "anchor_states"),
        (dict(anchor_states=[1, "a"], similarity_threshold=0.5), TypeError, "anchor_states"),
        (dict(group_ids=[[0], [0]]), TypeError, "group_ids"),
        (dict(trajectory_ids=[{}, {}]), TypeError, "trajectory_ids"),
        (dict(action_valid=[2, 1]), ValueError, "action_valid"),
        (dict(step_advantage_weight=float("inf")), ValueError, "step_advantage_weight"),
        (dict(invalid_action_penalty=float("nan")), ValueError, "invalid_action_penalty"),
    ],
)
def test_bad_input(change, exc, match):
    with pytest.raises(exc, match=match):
        compute_gigpo_advantages(**{**GOOD, **change})


def test_empty_input_gives_empty_result():
    res = compute_gigpo_advantages(rewards=[], group_ids=[], trajectory_ids=[], anchor_states=[])
    assert res.advantages.shape == (0,) and res.anchor_group_ids.shape == (0,)
    res = compute_gigpo_advantages(rewards=torch.zeros(0), group_ids=[], trajectory_ids=[], anchor_states=[])
    assert isinstance(res.advantages, torch.Tensor) and res.advantages.numel() == 0


# --------------------------------------------------------------------------
# property tests
# --------------------------------------------------------------------------

_traj = st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from([0.0, 0.5, 1.0, 2.0])), min_size=1, max_size=5)
_groups = st.lists(st.lists(_traj, min_size=1, max_size=4), min_size=1, max_size=3)


def _flatten(groups):
    rows = []
    for gi, trajs in enumerate(groups):
        for ti, steps in enumerate(trajs):
            rows.extend((gi, f"{gi}-{ti}", a, r) for a, r in steps)
    return rows


@settings(max_examples=50, deadline=None)
@given(_groups, st.randoms(use_true_random=False), st.sampled_from(["mean_norm", "mean_std_norm"]),
       st.sampled_from(["rows", "trajectories"]))
def test_property_trajectory_permutation(groups, rnd, mode, episode_stats):
    rows = _flatten(groups)
    base = _run(rows, mode=mode, episode_stats=episode_stats)
    keys = sorted({(g, t) for g, t, _, _ in rows})
    rnd.shuffle(keys)
    order = [i for k in keys for i, row in enumerate(rows) if (row[0], row[1]) == k]
    out = _run([rows[i] for i in order], mode=mode, episode_stats=episode_stats)
    for name in ("episode_advantages", "step_advantages", "advantages", "step_returns"):
        np.testing.assert_allclose(getattr(out, name), getattr(base, name)[order], atol=1e-9)
    assert _same_partition(out.anchor_group_ids, base.anchor_group_ids[order])


@settings(max_examples=50, deadline=None)
@given(_groups, st.sampled_from(["mean_norm", "mean_std_norm"]))
def test_property_unique_anchors_give_zero_step_advantage(groups, mode):
    rows = [(g, t, f"{g}/{t}/{i}", r) for i, (g, t, _, r) in enumerate(_flatten(groups))]
    res = _run(rows, mode=mode)
    assert np.all(res.step_advantages == 0.0)
    np.testing.assert_array_equal(res.anchor_group_sizes, 1)


def _grpo(rows, mode, per_row):
    """GRPO advantage, computed directly: normalised R_tau over the task group."""
    R = {}
    for g, t, _, r in rows:
        R[(g, t)] = R.get((g, t), 0.0) + r
    out = []
    for g, t, _, _ in rows:
        if sum(1 for g2, _ in R if g2 == g) == 1:  # one trajectory in the group: no comparison, 0
            out.append(0.0)
            continue
        pop = [R[(g2, t2)] for g2, t2, _, _ in rows if g2 == g] if per_row else \
              [v for (g2, _), v in R.items() if g2 == g]
        mean, std = statistics.fmean(pop), statistics.stdev(pop)
        x = R[(g, t)] - mean
        out.append(x / (std + 1e-6) if mode == "mean_std_norm" else x)
    return np.array(out)


@settings(max_examples=50, deadline=None)
@given(_groups, st.sampled_from(["mean_norm", "mean_std_norm"]), st.sampled_from(["rows", "trajectories"]))
def test_property_omega_zero_is_grpo(groups, mode, episode_stats):
    rows = _flatten(groups)
    res = _run(rows, mode=mode, episode_stats=episode_stats, step_advantage_weight=0.0)
    np.testing.assert_allclose(res.advantages, _grpo(rows, mode, episode_stats == "rows"), atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(_groups, st.sampled_from(["mean_norm", "mean_std_norm"]), st.sampled_from(["rows", "trajectories"]),
       st.booleans(), st.floats(0.0, 1.0))
def test_property_never_nan(groups, mode, episode_stats, all_equal, gamma):
    rows = _flatten(groups)
    if all_equal:
        rows = [(g, t, a, 1.0) for g, t, a, _ in rows]
    valid = [i % 3 != 0 for i in range(len(rows))]
    res = _run(rows, mode=mode, episode_stats=episode_stats, gamma=gamma, action_valid=valid)
    for name in ("episode_advantages", "step_advantages", "advantages", "step_returns"):
        assert np.all(np.isfinite(getattr(res, name)))
    if all_equal:
        # all-equal rewards, same anchor, same turn index -> identical G -> A_S exactly 0 for the valid rows
        # of groups whose rows are all valid; simplest exact check: no penalty at all
        res0 = _run(rows, mode=mode, episode_stats=episode_stats, gamma=gamma)
        assert np.all(np.isfinite(res0.advantages))
        if episode_stats == "trajectories":
            lengths = {}
            for g, t, _, _ in rows:
                lengths[(g, t)] = lengths.get((g, t), 0) + 1
            for g in {g for g, _ in lengths}:
                if len({v for (g2, _), v in lengths.items() if g2 == g}) == 1 and \
                        sum(1 for (g2, _) in lengths if g2 == g) > 1:
                    idx = [i for i, row in enumerate(rows) if row[0] == g]
                    assert np.all(res0.episode_advantages[idx] == 0.0)
