from math import comb

import pytest

from gigpo_trl.envs import make_env
from gigpo_trl.envs.base import check_env
from gigpo_trl.envs.corridor import EVAL_IDS, TRAIN_IDS, CorridorEnv, Room, generate_corridor

ROOM1 = "room 1: up arch, right niche"


def test_task_zero_rendered_literally_and_registered():
    env = make_env("corridor")
    obs, info = env.reset(0, 0)
    assert isinstance(env, CorridorEnv)
    assert generate_corridor(0)[:2] == (Room("up", "arch", "right", "niche"), Room("right", "arch", "left", "closet"))
    assert obs == ROOM1
    assert env.legal_moves() == ["up", "right"]
    assert info["admissible_actions"] == ["up", "down", "left", "right"]
    assert info["task_type"] == "corridor12" and info["room"] == 0 and info["won"] is False
    assert env.max_turns == 24


def test_optimal_episode_is_twelve_turns_and_rewarded_only_at_the_end():
    env = CorridorEnv()
    env.reset(0, 0)
    path = env.shortest_path_actions()
    assert len(path) == 12
    assert path[:3] == ["up", "right", "right"]
    rewards = []
    for i, move in enumerate(path):
        assert env.expert_action() == move
        obs, reward, done, info = env.step(move)
        rewards.append(reward)
        assert done == (i == 11)
    assert rewards == [0.0] * 11 + [1.0]
    assert info["won"] is True and obs == "outside: you found the exit"
    assert CorridorEnv(length=12).shortest_path_actions() == []  # before reset: nothing to walk


def test_dead_end_costs_two_turns_and_revisits_the_room_observation():
    env = CorridorEnv()
    env.reset(0, 0)
    obs, reward, done, info = env.step("right")  # room 1's niche
    assert obs == "niche off room 1: left way out"
    assert info["in_dead_end"] is True and env.legal_moves() == ["left"] and reward == 0.0 and not done
    obs, reward, *_ = env.step("up")  # a wall inside the niche: valid, nothing happens
    assert obs == "niche off room 1: left way out" and reward == 0.0
    obs, *_ = env.step("left")
    assert obs == ROOM1  # back in the same state -> identical observation (anchor state)
    obs, _, _, info = env.step("down")  # a wall of room 1
    assert obs == ROOM1 and info["action_valid"] is True and info["turn"] == 4
    obs, *_ = env.step("up")
    assert obs == "room 2: left closet, right arch"


@pytest.mark.parametrize("bad", ["jump", "", "up up", "<invalid>", None, 3])
def test_invalid_action_changes_nothing(bad):
    env = CorridorEnv()
    env.reset(0, 0)
    obs, reward, done, info = env.step(bad)
    assert obs == ROOM1 and reward == 0.0 and not done and info["action_valid"] is False
    assert env.step("  UP ")[3]["room"] == 1  # case and whitespace ignored


def test_truncation_at_max_turns_without_reward():
    env = CorridorEnv(length=3, max_turns=4)
    env.reset(5, 5)
    wall = next(m for m in ("up", "down", "left", "right") if m not in env.legal_moves())
    for t in range(4):
        obs, reward, done, info = env.step(wall)
        assert reward == 0.0 and done == (t == 3)
    assert info["truncated"] is True and info["won"] is False
    assert env.step(env.expert_action())[1:3] == (0.0, True)  # after the end nothing changes


def test_determinism_per_task_and_seed_ignored():
    a, b = CorridorEnv(), CorridorEnv()
    for task in (0, 7, 1_000_003):
        assert a.reset(task, 0) == b.reset(task, 123)
        for move in ("left", "up", "right", "down", "up"):
            assert a.step(move) == b.step(move)
    assert generate_corridor(7) == generate_corridor(7) and generate_corridor(7) != generate_corridor(8)
    check_env(CorridorEnv())


def test_splits_disjoint_in_ids_and_layouts():
    env = CorridorEnv()
    train, ev = env.tasks("train"), env.tasks("eval")
    assert train["task"][:3] == [0, 1, 2] and len(train) == 10_000 and len(ev) == 500
    assert set(TRAIN_IDS).isdisjoint(EVAL_IDS)
    train_layouts = {generate_corridor(i) for i in TRAIN_IDS}
    assert len(train_layouts) == 10_000
    assert not any(generate_corridor(i) in train_layouts for i in EVAL_IDS)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        env.tasks("dev")


def test_every_room_has_two_doors_and_random_door_choice_success_matches_negative_binomial():
    rooms = [r for i in range(200) for r in generate_corridor(i)]
    assert all(r.passage != r.dead_end for r in rooms)
    kinds = {(r.passage_kind, r.dead_end_kind) for r in rooms}
    assert kinds == {(p, d) for p in ("arch", "stairs") for d in ("closet", "niche")}
    # Choosing uniformly between the two doors (and always walking back out of a dead end) succeeds within
    # 24 turns iff there are <= 6 wrong doors over 12 rooms: sum_k C(11 + k, k) / 2**(12 + k), k = 0..6.
    expected = sum(comb(11 + k, k) / 2 ** (12 + k) for k in range(7))
    assert expected == pytest.approx(0.1189, abs=1e-4)
    import random

    rng, env, wins = random.Random(0), CorridorEnv(), 0
    for task in range(4000):
        env.reset(task)
        done = False
        while not done:
            _, _, done, info = env.step(rng.choice(env.legal_moves()))
        wins += info["won"]
    assert wins / 4000 == pytest.approx(expected, abs=0.015)


def test_bad_constructor_values_named():
    with pytest.raises(ValueError, match="length must be >= 1"):
        CorridorEnv(length=0)
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        CorridorEnv(max_turns=0)


def test_left_right_variant_used_by_the_learning_benchmark():
    env = CorridorEnv(directions=2, max_turns=30)
    obs, info = env.reset(0, 0)
    assert obs == "room 1: left niche, right arch" and info["admissible_actions"] == ["left", "right"]
    assert info["task_type"] == "corridor12-lr"
    assert generate_corridor(0, 12, 2)[:2] == (Room("right", "arch", "left", "niche"),
                                                Room("left", "stairs", "right", "niche"))
    rooms = [r for i in range(100) for r in generate_corridor(i, 12, 2)]
    assert {(r.passage, r.dead_end) for r in rooms} == {("left", "right"), ("right", "left")}
    obs, *_ = env.step("left")
    assert obs == "niche off room 1: right way out" and env.legal_moves() == ["right"]
    assert env.step("up")[0] == obs  # up/down are walls everywhere
    assert env.step("right")[0] == "room 1: left niche, right arch"
    assert len(env.shortest_path_actions()) == 12
    train_layouts = {generate_corridor(i, 12, 2) for i in TRAIN_IDS}
    assert not any(generate_corridor(i, 12, 2) in train_layouts for i in EVAL_IDS)
    with pytest.raises(ValueError, match="directions must be 2"):
        CorridorEnv(directions=3)
