"""History-consistent step groups (HGPO, arXiv 2602.22817): estimator option, config fields, collector keys and
the trainer pass-through."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from toy_env import CorridorEnv, NoisyCorridorEnv

from gigpo_trl import GiGPOConfig, GiGPOTrainer, compute_gigpo_advantages
from gigpo_trl.metrics import level_metrics
from gigpo_trl.parsing import parse_action
from gigpo_trl.rollout import RolloutCollector, history_pair_hash

# --------------------------------------------------------------------------
# hand-computed case: one task group, gamma = 1, mean_norm, alpha = 1
# --------------------------------------------------------------------------
# History keys name the (observation, action) pair of a previous turn. s1 is reached with three different
# histories (A, B, and W then A); t3's last row has the same last pair A as the turn-1 rows of t0/t2 but one turn
# more of history, so it leaves them at level 2 (where t0/t2 have "before the episode start").
A, B, C, W = "s0/a", "s0/b", "s1/c", "s0/w"
CASE = [  # (trajectory, anchor, history keys, reward)
    ("t0", "s0", (), 0), ("t0", "s1", (A,), 0), ("t0", "s2", (A, C), 1),
    ("t1", "s0", (), 0), ("t1", "s1", (B,), 0), ("t1", "s2", (B, C), 0),
    ("t2", "s0", (), 0), ("t2", "s1", (A,), 0), ("t2", "s2", (A, C), 0),
    ("t3", "s0", (), 0), ("t3", "s0", (W,), 0), ("t3", "s1", (W, A), 1),
]
# Returns G (gamma 1): t0 1,1,1  t1 0,0,0  t2 0,0,0  t3 1,1,1.
# Level 0 (GiGPO): s0 {t0,t1,t2,t3 r0, t3 r1} mean 3/5; s1 {t0,t1,t2 r1, t3 r2} mean 1/2; s2 {t0,t1,t2} mean 1/3.
A0 = [2 / 5, 1 / 2, 2 / 3, -3 / 5, -1 / 2, -1 / 3, -3 / 5, -1 / 2, -1 / 3, 2 / 5, 2 / 5, 1 / 2]
# Level 1: s0+start {turn-0 rows} mean 1/2; s0+W {t3 r1} alone; s1+A {t0 r1, t2 r1, t3 r2} mean 2/3; s1+B alone;
# s2+C {t0,t1,t2} mean 1/3.
A1 = [1 / 2, 1 / 3, 2 / 3, -1 / 2, 0, -1 / 3, -1 / 2, -2 / 3, -1 / 3, 1 / 2, 0, 1 / 3]
S1 = [4, 3, 3, 4, 1, 3, 4, 3, 3, 4, 1, 3]
# Level 2: s1+(start, A) {t0 r1, t2 r1} mean 1/2; s1+(W, A) alone; s2+(A, C) {t0, t2} mean 1/2; s2+(B, C) alone.
A2 = [1 / 2, 1 / 2, 1 / 2, -1 / 2, 0, 0, -1 / 2, -1 / 2, -1 / 2, 1 / 2, 0, 0]
S2 = [4, 2, 2, 4, 1, 1, 4, 2, 2, 4, 1, 1]


def _expected(K):
    """A_S = sum_k w_k A_k / sum_k w_k over the levels whose group has >= 2 rows, w_k = k + 1."""
    out = []
    for i in range(len(CASE)):
        terms = [(1, A0[i])] + [(k + 1, a[i]) for k, (a, s) in enumerate(((A1, S1), (A2, S2))[:K], 1) if s[i] > 1]
        out.append(sum(w * a for w, a in terms) / sum(w for w, _ in terms))
    return out


def _run_case(rows=CASE, **kw):
    t, a, h, r = (list(c) for c in zip(*rows))
    kw.setdefault("step_grouping", "hierarchical")
    return compute_gigpo_advantages(rewards=r, group_ids=["g"] * len(rows), trajectory_ids=t, anchor_states=a,
                                    history_keys=h, gamma=1.0, **kw)


def test_hand_computed_k1():
    res = _run_case(hierarchy_depth=1)
    expected = [7 / 15, 7 / 18, 2 / 3, -8 / 15, -1 / 2, -1 / 3, -8 / 15, -11 / 18, -1 / 3, 7 / 15, 2 / 5, 7 / 18]
    np.testing.assert_allclose(res.step_advantages, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(expected, _expected(1), atol=1e-12)
    assert res.level_group_sizes[:, 1].tolist() == S1
    # A_E is untouched: R_tau 1, 0, 0, 1 over rows (3 each), mean 1/2
    np.testing.assert_allclose(res.episode_advantages, np.repeat([0.5, -0.5, -0.5, 0.5], 3), atol=1e-12)
    np.testing.assert_allclose(res.advantages, res.episode_advantages + res.step_advantages, atol=1e-12)


def test_hand_computed_k2_with_episode_start():
    res = _run_case(hierarchy_depth=2)
    expected = [29 / 60, 4 / 9, 7 / 12, -31 / 60, -1 / 2, -1 / 3, -31 / 60, -5 / 9, -5 / 12, 29 / 60, 2 / 5, 7 / 18]
    np.testing.assert_allclose(res.step_advantages, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(expected, _expected(2), atol=1e-12)
    assert res.level_group_sizes.tolist() == [list(s) for s in zip([5, 4, 3] * 3 + [5, 5, 4], S1, S2)]
    # t3's last row shares A with the turn-1 rows of t0/t2 at level 1, but not at level 2 (one more turn of history)
    ids = res.level_group_ids
    assert ids[11, 1] == ids[1, 1] == ids[7, 1] and ids[11, 2] != ids[1, 2] and ids[1, 2] == ids[7, 2]
    # level 0 is GiGPO's step group
    assert np.array_equal(ids[:, 0], res.anchor_group_ids)


def test_alpha_zero_weighs_levels_equally_and_long_histories_are_cut_to_k():
    res = _run_case(hierarchy_depth=1, hierarchy_alpha=0.0)
    expected = [(a0 + a1) / 2 if s > 1 else a0 for a0, a1, s in zip(A0, A1, S1)]
    np.testing.assert_allclose(res.step_advantages, expected, atol=1e-12)
    # keys older than K turns are not read: prefixing every history with a distinct key changes nothing at K = 1
    longer = [(t, a, (f"old{i}",) + h if h else h, r) for i, (t, a, h, r) in enumerate(CASE)]
    np.testing.assert_array_equal(_run_case(longer, hierarchy_depth=1).step_advantages,
                                  _run_case(hierarchy_depth=1).step_advantages)
    # ... but read at K = 2: the turn-1 rows of t0/t2 (A after distinct keys) no longer share G_2, while their
    # turn-2 rows (last two keys A, C) still do
    sizes = _run_case(longer, hierarchy_depth=2).level_group_sizes
    assert S2[1] == 2 and sizes[1, 2] == sizes[7, 2] == 1 and sizes[2, 2] == sizes[8, 2] == 2


def test_std_norm_per_level():
    res = _run_case(hierarchy_depth=1, mode="mean_std_norm")
    # row 1 (t0, s1): level 0 {1, 0, 0, 1}: (1 - 1/2) / std; level 1 {1, 0, 1}: (1 - 2/3) / std
    std0, std1 = np.std([1, 0, 0, 1], ddof=1), np.std([1, 0, 1], ddof=1)
    a = (0.5 / (std0 + 1e-6) + 2 * (1 / 3) / (std1 + 1e-6)) / 3
    assert res.step_advantages[1] == pytest.approx(a, abs=1e-12)


# --------------------------------------------------------------------------
# random rows: K = 0 is GiGPO, nesting, permutations, numpy vs torch
# --------------------------------------------------------------------------


def _random_rows(seed, n_groups=3, n_traj=4, max_turns=6, n_states=3):
    """Corridor-like trajectories with revisited states; history key = hash-free (state, action) pairs."""
    rng = random.Random(seed)
    rows = []
    for g in range(n_groups):
        for t in range(n_traj):
            state, history = 0, []
            for turn in range(rng.randint(1, max_turns)):
                action = rng.choice("ab")
                reward = float(rng.random() < 0.3)
                rows.append((g, t, f"s{state}", tuple(history), reward, rng.random() > 0.1))
                history.append((f"s{state}", action))
                state = (state + (1 if action == "a" else -1)) % n_states
    return rows


def _run(rows, **kw):
    g, t, a, h, r, v = (list(c) for c in zip(*rows))
    return compute_gigpo_advantages(rewards=np.array(r), group_ids=g, trajectory_ids=t, anchor_states=a,
                                    history_keys=h, action_valid=np.array(v), **kw)


FIELDS = ("episode_advantages", "step_advantages", "advantages", "step_returns", "anchor_group_ids",
          "episode_returns", "anchor_group_sizes")


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_depth_zero_equals_gigpo_exactly(seed, mode):
    rows = _random_rows(seed)
    state = _run(rows, mode=mode)
    hier = _run(rows, mode=mode, step_grouping="hierarchical", hierarchy_depth=0)
    for name in FIELDS:
        assert np.array_equal(getattr(state, name), getattr(hier, name)), name
    assert np.array_equal(hier.level_group_ids[:, 0], state.anchor_group_ids)
    # history_keys are not needed at K = 0
    g, t, a, _, r, v = (list(c) for c in zip(*rows))
    bare = compute_gigpo_advantages(rewards=np.array(r), group_ids=g, trajectory_ids=t, anchor_states=a,
                                    action_valid=np.array(v), mode=mode, step_grouping="hierarchical",
                                    hierarchy_depth=0)
    assert np.array_equal(bare.advantages, state.advantages)
    # and with K > 0 the step level changes on these rows (the history tells revisits apart)
    assert not np.array_equal(_run(rows, mode=mode, step_grouping="hierarchical", hierarchy_depth=2).advantages,
                              state.advantages)


@pytest.mark.parametrize("seed", [0, 3])
def test_groups_are_nested_and_sizes_non_increasing(seed):
    res = _run(_random_rows(seed, max_turns=9), step_grouping="hierarchical", hierarchy_depth=4)
    ids, sizes = res.level_group_ids, res.level_group_sizes
    assert ids.shape == sizes.shape == (len(res.advantages), 5)
    for k in range(1, 5):
        parent = {}
        for child, par in zip(ids[:, k].tolist(), ids[:, k - 1].tolist()):
            assert parent.setdefault(child, par) == par  # every G_k lies in one G_{k-1}
        assert (sizes[:, k] <= sizes[:, k - 1]).all()
        assert np.array_equal(np.bincount(ids[:, k])[ids[:, k]], sizes[:, k])
    assert (sizes[:, 4] < sizes[:, 0]).any()


def _interleave(rows, rng):
    """A random order of the rows that keeps each trajectory's rows in turn order."""
    queues = {}
    for i, row in enumerate(rows):
        queues.setdefault((row[0], row[1]), []).append(i)
    order, keys = [], list(queues)
    while keys:
        key = rng.choice(keys)
        order.append(queues[key].pop(0))
        if not queues[key]:
            keys.remove(key)
    return order


def test_permutation_invariance():
    rows = _random_rows(5, max_turns=8)
    ref = _run(rows, step_grouping="hierarchical", hierarchy_depth=2, mode="mean_std_norm")
    rng = random.Random(0)
    for _ in range(3):
        order = _interleave(rows, rng)
        res = _run([rows[i] for i in order], step_grouping="hierarchical", hierarchy_depth=2, mode="mean_std_norm")
        np.testing.assert_allclose(res.advantages, ref.advantages[order], atol=1e-12)
        np.testing.assert_array_equal(res.level_group_sizes, ref.level_group_sizes[order])
        for k in range(3):
            x, y = res.level_group_ids[:, k], ref.level_group_ids[order, k]
            assert np.array_equal(x[:, None] == x[None, :], y[:, None] == y[None, :])


def test_numpy_and_torch_inputs_agree():
    rows = _random_rows(7)
    g, t, a, h, r, v = (list(c) for c in zip(*rows))
    ref = _run(rows, step_grouping="hierarchical", hierarchy_depth=2)
    # torch ids and rewards, history keys as int64 hash tensors (what a caller holding hashes would pass)
    hashed = [torch.tensor([history_pair_hash(*p) for p in keys], dtype=torch.int64) for keys in h]
    res = compute_gigpo_advantages(
        rewards=torch.tensor(r, dtype=torch.float64), group_ids=torch.tensor(g), trajectory_ids=torch.tensor(t),
        anchor_states=a, action_valid=torch.tensor(v), history_keys=hashed, step_grouping="hierarchical",
        hierarchy_depth=2,
    )
    assert isinstance(res.advantages, torch.Tensor) and res.level_group_ids.dtype == torch.long
    np.testing.assert_allclose(res.advantages.numpy(), ref.advantages, atol=1e-12)
    np.testing.assert_array_equal(res.level_group_sizes.numpy(), ref.level_group_sizes)


def test_history_as_2d_array():
    # (R, D) array: every row has D keys (here all rows are past the episode start)
    keys = np.array([[1, 2], [1, 2], [3, 2], [1, 2]])
    res = compute_gigpo_advantages(rewards=[1.0, 0.0, 0.0, 1.0], group_ids=[0] * 4, trajectory_ids=[0, 1, 2, 3],
                                   anchor_states=["s"] * 4, history_keys=keys, step_grouping="hierarchical",
                                   hierarchy_depth=2)
    assert res.level_group_sizes.tolist() == [[4, 4, 3], [4, 4, 3], [4, 4, 1], [4, 4, 3]]
    # row 0: level 0 (1 - 1/2) weight 1, level 1 the same, weight 2; level 2 {1, 0, 1}: 1 - 2/3, weight 3
    assert res.step_advantages[0] == pytest.approx((0.5 + 2 * 0.5 + 3 / 3) / 6)
    assert res.step_advantages[2] == pytest.approx(-0.5)
    # one key per row (D = 1 < K): the rows count as one turn into their episodes; D = 0: all at the start
    one = compute_gigpo_advantages(rewards=[1.0, 0.0, 0.0, 1.0], group_ids=[0] * 4, trajectory_ids=[0, 1, 2, 3],
                                   anchor_states=["s"] * 4, history_keys=torch.tensor([[2], [2], [3], [2]]),
                                   step_grouping="hierarchical", hierarchy_depth=2)
    assert one.level_group_sizes.tolist() == [[4, 3, 3], [4, 3, 3], [4, 1, 1], [4, 3, 3]]
    none = compute_gigpo_advantages(rewards=[1.0, 0.0], group_ids=[0, 0], trajectory_ids=[0, 1],
                                    anchor_states=["s"] * 2, history_keys=np.zeros((2, 0), dtype=np.int64),
                                    step_grouping="hierarchical", hierarchy_depth=2)
    assert none.level_group_sizes.tolist() == [[2, 2, 2]] * 2 and none.step_advantages.tolist() == [0.5, -0.5]


def test_key_types_int_fast_path_agrees_with_general_path():
    rows = _random_rows(11)
    _, _, _, h, _, _ = zip(*rows)
    as_ints = [tuple(history_pair_hash(*p) for p in keys) for keys in h]
    as_text = [tuple(f"{history_pair_hash(*p)}" for p in keys) for keys in h]
    huge = [tuple(2**70 + history_pair_hash(*p) for p in keys) for keys in h]  # beyond int64
    results = [_run([r[:3] + (k,) + r[4:] for r, k in zip(rows, keys)], step_grouping="hierarchical",
                    hierarchy_depth=3) for keys in (h, as_ints, as_text, huge)]
    for res in results[1:]:
        np.testing.assert_array_equal(res.advantages, results[0].advantages)
        np.testing.assert_array_equal(res.level_group_sizes, results[0].level_group_sizes)


def test_empty_input():
    res = compute_gigpo_advantages(rewards=[], group_ids=[], trajectory_ids=[], anchor_states=[], history_keys=[],
                                   step_grouping="hierarchical", hierarchy_depth=2)
    assert res.level_group_ids.shape == (0, 3) and res.advantages.shape == (0,)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(step_grouping="history"), ValueError, "step_grouping must be one of"),
    (dict(hierarchy_depth=-1), ValueError, "hierarchy_depth must be an int >= 0, got -1"),
    (dict(hierarchy_depth=1.5), TypeError, "hierarchy_depth must be an int >= 0, got float"),
    (dict(hierarchy_depth=True), TypeError, "hierarchy_depth must be an int >= 0, got bool"),
    (dict(hierarchy_alpha=-1.0), ValueError, "hierarchy_alpha must be finite and in"),
    (dict(hierarchy_alpha="1"), TypeError, "hierarchy_alpha must be a real number"),
    (dict(history_keys=None), ValueError, "history_keys is required when step_grouping='hierarchical'"),
    (dict(history_keys=[()] * 3), ValueError, "history_keys has length 3 but rewards has length 2"),
    (dict(history_keys=["ab", ()]), TypeError, r"history_keys\[0\] must be a sequence of per-turn keys"),
    (dict(history_keys=[(1,), 5]), TypeError, r"history_keys\[1\] must be a sequence"),
    (dict(history_keys=[(bytearray(b"x"),), ()]), TypeError, "history_keys: unhashable"),
])
def test_bad_values_name_the_argument(kwargs, exc, match):
    base = dict(rewards=[1.0, 0.0], group_ids=[0, 0], trajectory_ids=[0, 1], anchor_states=["s", "s"],
                history_keys=[(), ()], step_grouping="hierarchical", hierarchy_depth=2)
    base.update(kwargs)
    with pytest.raises(exc, match=match):
        compute_gigpo_advantages(**base)


# --------------------------------------------------------------------------
# config, metrics, collector, trainer
# --------------------------------------------------------------------------


def test_config_fields_and_validation(tmp_path):
    common = dict(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, use_cpu=True)
    args = GiGPOConfig(**common)
    assert args.step_grouping == "state" and args.hierarchy_depth == 2
    assert GiGPOConfig(**common, step_grouping="hierarchical", hierarchy_depth=0).hierarchy_depth == 0
    with pytest.raises(ValueError, match=r"step_grouping must be one of \['state', 'hierarchical'\], got 'hgpo'"):
        GiGPOConfig(**common, step_grouping="hgpo")
    with pytest.warns(UserWarning, match=r"hierarchy_depth=2 > history_length=1: the HGPO levels beyond 1"):
        GiGPOConfig(**common, step_grouping="hierarchical", history_length=1)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"hierarchy_depth must be an int >= 0, got {bad!r}"):
            GiGPOConfig(**common, hierarchy_depth=bad)


def test_level_metrics():
    ids = np.array([[0, 0], [0, 0], [0, 1], [1, 2]])  # level 0: sizes 3, 1; level 1: sizes 2, 1, 1
    m = level_metrics(ids)
    assert m["anchor/level_0/group_size_mean"] == 2.0 and m["anchor/level_0/singleton_fraction"] == 0.5
    assert m["anchor/level_1/group_size_mean"] == pytest.approx(4 / 3)
    assert m["anchor/level_1/singleton_fraction"] == pytest.approx(2 / 3)
    assert m["anchor/level_1/row_group_size_mean"] == pytest.approx((4 + 1 + 1) / 4)
    assert m["anchor/level_1/num_groups"] == 3.0 and level_metrics(np.zeros((0, 2))) == {}


RIGHT = "<think>r</think><action>right</action>"
LEFT = "<think>l</think><action>left</action>"


def test_collector_records_history_keys(tiny_tokenizer):
    texts = [RIGHT, LEFT, "junk"]
    tok = lambda msgs: tiny_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,  # noqa
                                                           return_dict=True)["input_ids"]
    policy = lambda ids: ([tiny_tokenizer.encode(texts[i % 3]) for i in range(len(ids))], None)  # noqa: E731
    collector = RolloutCollector({"default": CorridorEnv}, generate_fn=policy, tokenize_fn=tok,
                                 decode_fn=lambda ids: tiny_tokenizer.batch_decode(ids, skip_special_tokens=True),
                                 max_turns=4, history_key_depth=2)
    batch = collector.collect([{"task": 6, "seed": 2}] * 3, group_ids=["g"] * 3)
    for traj in batch.trajectories:
        rows = [r for r in batch.rows if r.trajectory_id == traj.trajectory_id]
        pairs = [(r.anchor_state, parse_action(r.completion_text, fallback="stay").action) for r in rows]
        for t, row in enumerate(rows):
            assert row.history_key == tuple(history_pair_hash(*p) for p in pairs[:t])[-2:]
    at_start = [r for r in batch.rows if r.turn == 0]
    assert len({r.anchor_state for r in at_start}) == 1 and {r.history_key for r in at_start} == {()}
    # hashes are stable numbers (blake2b of "len:observation" + action, no per-process salt): pinned value
    assert history_pair_hash("You are at position 2.", "left") == 6335927845889882839
    assert history_pair_hash("ab", "c") != history_pair_hash("a", "bc")
    # the default records nothing
    collector.history_key_depth = 0
    assert {r.history_key for r in collector.collect([{"task": 4, "seed": 0}] * 2, ["h"] * 2).rows} == {()}


def test_trainer_passes_history_keys_and_logs_levels(tmp_path, tiny_model_dir, tiny_tokenizer):
    from test_trainer import capture_rollouts, make_args

    args = make_args(tmp_path, step_grouping="hierarchical", hierarchy_depth=2, max_turns=5)
    trainer = GiGPOTrainer(tiny_model_dir, env=NoisyCorridorEnv, args=args, processing_class=tiny_tokenizer)
    batches = capture_rollouts(trainer)
    trainer.model.train()
    out = trainer._generate_and_score_completions([{"task": 5, "seed": 1}] * 4 + [{"task": 6, "seed": 2}] * 4)
    rows = batches[0].rows
    assert any(len(r.history_key) == 2 for r in rows) and all(len(r.history_key) == min(r.turn, 2) for r in rows)
    kw = dict(rewards=np.array([r.reward for r in rows]), group_ids=[r.group_id for r in rows],
              trajectory_ids=[r.trajectory_id for r in rows], anchor_states=[r.anchor_state for r in rows],
              action_valid=np.array([r.action_valid for r in rows]))
    expected = compute_gigpo_advantages(**kw, history_keys=[r.history_key for r in rows],
                                        step_grouping="hierarchical", hierarchy_depth=2)
    torch.testing.assert_close(out["advantages"][: len(rows)], torch.tensor(expected.advantages, dtype=torch.float32))
    logged = trainer._metrics["train"]
    for key, value in level_metrics(expected.level_group_ids).items():
        assert logged[key] == [value]
    assert "anchor/level_2/singleton_fraction" in logged and "anchor/level_3/group_size_mean" not in logged
