import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gigpo_trl.envs import check_env
from gigpo_trl.envs.frozenlake import FrozenLakeEnv, generate_map

MAP0 = "P _ _ _\nO O _ _\n_ O O _\nO _ _ G"


def test_map_zero_rendered_literally():
    env = FrozenLakeEnv()
    obs, info = env.reset(0, 0)
    assert generate_map(0) == ("SFFF", "HHFF", "FHHF", "HFFG")
    assert obs == MAP0
    assert info["admissible_actions"] == ["up", "down", "left", "right"]
    assert info["task_type"] == "4x4"
    assert info["won"] is False
    assert "goal" in info["instruction"]


def test_edges_keep_position_and_revisits_repeat_observation():
    env = FrozenLakeEnv()
    start, _ = env.reset(0, 0)
    for move in ("up", "left"):
        obs, reward, done, info = env.step(move)
        assert obs == start and reward == 0.0 and not done and info["action_valid"] is True
    obs, *_ = env.step("right")
    assert obs == "_ P _ _\nO O _ _\n_ O O _\nO _ _ G"
    obs, *_ = env.step("left")
    assert obs == start  # same cell -> identical observation (anchor state)
    assert env.anchor_state(obs) == env.anchor_state(start)


def test_hole_ends_episode_without_reward():
    env = FrozenLakeEnv()
    env.reset(0, 0)
    obs, reward, done, info = env.step("down")  # (1, 0) is a hole
    assert done and reward == 0.0 and info["won"] is False
    # stepping after the end changes nothing
    obs2, reward2, done2, _ = env.step("right")
    assert obs2 == obs and reward2 == 0.0 and done2


def test_goal_via_bfs_path():
    env = FrozenLakeEnv(success_reward=10.0)
    env.reset(0, 0)
    path = env.shortest_path_actions()
    assert path == ["right", "right", "down", "right", "down", "down"]
    for i, move in enumerate(path):
        assert env.expert_action() == move
        obs, reward, done, info = env.step(move)
        assert done == (i == len(path) - 1)
    assert reward == 10.0 and info["won"] is True
    assert obs.splitlines()[-1] == "O _ _ P"


@pytest.mark.parametrize("bad", ["jump", "", "up up", "go left", "<invalid>", None, 3])
def test_invalid_action_keeps_state(bad):
    env = FrozenLakeEnv()
    start, _ = env.reset(0, 0)
    obs, reward, done, info = env.step(bad)
    assert obs == start and reward == 0.0 and not done and info["action_valid"] is False


def test_action_case_and_whitespace_insensitive():
    env = FrozenLakeEnv()
    env.reset(0, 0)
    obs, _, _, info = env.step("  RIGHT \n")
    assert info["action_valid"] and obs.startswith("_ P")


def test_truncation_at_max_turns():
    env = FrozenLakeEnv(max_turns=3)
    assert FrozenLakeEnv().max_turns == 10
    env.reset(0, 0)
    results = [env.step("up") for _ in range(3)]
    assert [r[2] for r in results] == [False, False, True]
    assert results[-1][3]["truncated"] is True and results[-1][3]["won"] is False


def test_same_seed_same_first_observation_and_slippery_determinism():
    a, b = FrozenLakeEnv(is_slippery=True), FrozenLakeEnv(is_slippery=True)
    assert a.reset(17, 5)[0] == b.reset(17, 5)[0]
    trace_a = [a.step("right")[0] for _ in range(6)]
    trace_b = [b.step("right")[0] for _ in range(6)]
    assert trace_a == trace_b
    assert FrozenLakeEnv().reset(1, 1)[0] != FrozenLakeEnv().reset(0, 0)[0]


def test_splits():
    env = FrozenLakeEnv()
    train, evaluation = env.tasks("train"), env.tasks("eval")
    assert set(train.column_names) == {"task", "seed", "task_type"}
    assert len(train) >= 1000 and len(evaluation) >= 100
    assert not set(train["task"]) & set(evaluation["task"])
    assert len(set(train["task"])) == len(train)
    with pytest.raises(ValueError):
        env.tasks("bogus")


def test_check_env_passes():
    check_env(FrozenLakeEnv())
    check_env(FrozenLakeEnv(size=8, is_slippery=True), task=3, seed=3)


@settings(max_examples=60, deadline=None)
@given(map_id=st.integers(0, 10**7), size=st.sampled_from([4, 5, 8]))
def test_every_map_solvable_by_bfs(map_id, size):
    env = FrozenLakeEnv(size=size, max_turns=size * size)
    env.reset(map_id, map_id)
    path = env.shortest_path_actions()
    assert path is not None and len(path) >= 2 * (size - 1)
    total = 0.0
    for move in path:
        _, reward, done, info = env.step(move)
        total += reward
    assert done and info["won"] and math.isclose(total, 1.0)
