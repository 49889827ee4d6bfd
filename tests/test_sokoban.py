import pytest

from gigpo_trl.envs import check_env
from gigpo_trl.envs.sokoban import SokobanEnv, generate_level, is_solved, parse_level, render_level, solve

LEVEL = """
# # # # # #
# _ _ _ _ #
# _ P X O #
# _ _ _ _ #
# _ _ # _ #
# # # # # #
"""


def test_parse_render_roundtrip():
    level = parse_level(LEVEL)
    assert level.player == (2, 2) and level.boxes == {(2, 3)} and level.targets == {(2, 4)}
    assert render_level(level) == LEVEL.strip()
    assert parse_level("######\n#_PXO#\n######") == parse_level("# # # # # #\n# _ P X O #\n# # # # # #")


def test_push_onto_target_wins():
    env = SokobanEnv()
    obs, info = env.reset(LEVEL)
    assert obs == LEVEL.strip() and info["admissible_actions"] == ["up", "down", "left", "right"]
    obs, reward, done, info = env.step("right")
    assert obs.splitlines()[2] == "# _ _ P √ #"
    assert reward == 1.0 and done and info["won"] is True


def test_blocked_pushes_and_walls():
    env = SokobanEnv()
    env.reset(LEVEL)
    obs, *_ = env.step("up")
    assert obs.splitlines()[1] == "# _ P _ _ #"
    obs, reward, done, info = env.step("up")  # into the wall: no change
    assert obs.splitlines()[1] == "# _ P _ _ #" and reward == 0.0 and not done and info["action_valid"]
    env.step("right")
    obs, *_ = env.step("down")  # push the box down from (2,3) to (3,3)
    assert obs.splitlines()[2:4] == ["# _ _ P O #", "# _ _ X _ #"]
    obs2, *_ = env.step("down")  # box would go into the interior wall at (4,3): blocked
    assert obs2 == obs
    # a box cannot be pushed into another box
    two = SokobanEnv()
    start, _ = two.reset("######\n#PXX_#\n#OO__#\n######")
    obs, reward, done, _ = two.step("right")
    assert obs == start and reward == 0.0 and not done


def test_player_on_target_symbol_and_invalid_action():
    env = SokobanEnv()
    start, _ = env.reset("######\n#P_O_#\n#__X_#\n######")
    obs, reward, done, info = env.step("dance")
    assert obs == start and not info["action_valid"] and reward == 0.0 and not done
    env.step("right")
    obs, *_ = env.step("right")
    assert obs.splitlines()[1] == "# _ _ S _ #"


def test_generated_levels_solvable_not_solved_and_playable():
    env = SokobanEnv()
    lengths = []
    for level_id in range(200):
        level = generate_level(level_id)
        assert not is_solved(level)
        assert (level.height, level.width) == (6, 6) and len(level.boxes) == 1
        path = solve(level)
        assert path is not None and 2 <= len(path) <= env.max_turns
        lengths.append(len(path))
        obs, _ = env.reset(level_id, level_id)
        assert obs == render_level(level)
        for move in path:
            obs, reward, done, info = env.step(move)
        assert done and info["won"] and reward == 1.0
    assert max(lengths) >= 5  # not only trivial levels


def test_determinism_splits_and_check_env():
    env = SokobanEnv()
    assert env.reset(42, 42)[0] == SokobanEnv().reset(42, 42)[0]
    assert env.reset(42, 42)[0] != env.reset(43, 43)[0] or env.reset(44, 44)[0] != env.reset(42, 42)[0]
    train, evaluation = env.tasks("train"), env.tasks("eval")
    assert not set(train["task"]) & set(evaluation["task"])
    assert set(train.column_names) == {"task", "seed", "task_type"}
    with pytest.raises(ValueError):
        env.tasks("nope")
    check_env(env)
    check_env(SokobanEnv(dim_room=(7, 7), num_boxes=2, step_penalty=0.1), task=5, seed=5)


def test_truncation_and_step_penalty():
    env = SokobanEnv(max_turns=2, step_penalty=0.1)
    env.reset(LEVEL)
    _, r1, d1, _ = env.step("left")
    _, r2, d2, info = env.step("left")
    assert (r1, d1) == (-0.1, False) and r2 == -0.1 and d2 and info["truncated"]
