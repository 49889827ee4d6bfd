import itertools
from math import comb

import pytest

from gigpo_trl.envs import check_env, make_env
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


# ------------------------------------------------------------------ the map's options (issue 35)
def test_defaults_unchanged_by_the_map_options():
    env = CorridorEnv(directions=2, max_turns=30)
    obs, info = env.reset(0, 0)
    assert obs == "room 1: left niche, right arch" and env.anchor_state(obs) == obs
    assert "trapped" not in info and info["task_type"] == "corridor12-lr"


def test_turn_nuisance_separates_one_place_reached_at_two_turns_and_the_hook_drops_it():
    env = CorridorEnv(directions=2, max_turns=30, nuisance="turn")
    first, info = env.reset(0, 0)
    assert first == "room 1: left niche, right arch\nturn 0" and info["task_type"] == "corridor12-lr-turn"
    env.step("left")  # into the niche
    again, *_ = env.step("right")  # back out: the same place two turns later
    assert again == "room 1: left niche, right arch\nturn 2"
    assert again != first and env.anchor_state(again) == again  # exact anchors no longer match
    hooked = CorridorEnv(directions=2, max_turns=30, nuisance="turn", anchor_drops_nuisance=True)
    assert hooked.anchor_state(first) == hooked.anchor_state(again) == "room 1: left niche, right arch"


def test_clock_nuisance_never_repeats_across_instances_and_the_hook_drops_it():
    clock = itertools.count(1)  # one counter for the run's environments
    a = CorridorEnv(directions=2, nuisance="clock", anchor_drops_nuisance=True, clock=clock)
    b = CorridorEnv(directions=2, nuisance="clock", anchor_drops_nuisance=True, clock=clock)
    obs = [a.reset(0, 0)[0], b.reset(0, 0)[0]] + [e.step("right")[0] for e in (a, b)]
    assert len(set(obs)) == 4  # the same two states in two envs: four different observations
    stamps = [int(o.split("\nclock ")[1]) for o in obs]
    assert stamps == sorted(stamps) and len(set(stamps)) == 4
    assert [a.anchor_state(o) for o in obs] == ["room 1: left niche, right arch"] * 2 + [
        "room 2: left stairs, right niche"] * 2
    plain = CorridorEnv(directions=2, nuisance="clock")
    assert plain.anchor_state(obs[0]) == obs[0]
    with pytest.raises(ValueError, match="nuisance must be None, 'turn' or 'clock', got 'time'"):
        CorridorEnv(nuisance="time")


def test_a_fresh_clock_per_run_gives_every_run_the_same_clock_lines():
    def run(clock=None):
        env = CorridorEnv(directions=2, nuisance="clock", clock=clock)
        return [env.reset(0, 0)[0], env.step("right")[0], env.step("left")[0]]

    shared = itertools.count(1)
    for _ in range(3):
        run(shared)  # other runs on a shared counter move it on
    first = run(itertools.count(1))
    assert [o.split("\nclock ")[1] for o in first] == ["1", "2", "3"]
    assert run(itertools.count(1)) == first
    assert run() == first  # without a clock: the environment's own counter, from 1
    assert run(itertools.count(41))[0].endswith("\nclock 41")


def test_trap_door_ends_the_episode_with_reward_0_at_the_known_door():
    from gigpo_trl.envs.corridor import trap_room

    assert [trap_room(t, 12) for t in range(5)] == [0, 9, 7, 3, 3]
    env = CorridorEnv(directions=2, max_turns=30, trap_door=True)
    obs, info = env.reset(3, 0)  # task 3: room 4 (index 3) has the trap; its dead end is the left closet
    assert info["trapped"] is False and info["task_type"] == "corridor12-lr-trap"
    assert obs == "room 1: left closet, right arch"
    obs, reward, done, info = env.step("left")  # room 1's dead end is an ordinary one
    assert (obs, reward, done) == ("closet off room 1: right way out", 0.0, False)
    env.step("right")
    for _ in range(3):
        env.step("right")  # the passages of rooms 1-3
    assert env.render() == "room 4: left closet, right stairs"
    obs, reward, done, info = env.step("left")
    assert (obs, reward, done, info["trapped"], info["won"], info["turn"]) == (
        "trap door in room 4: you fell", 0.0, True, True, False, 6)
    assert env.step("right")[1:3] == (0.0, True)  # over: nothing more happens
    # the shortest path never touches the trap: reward 1 in 12 turns as without it
    env.reset(3, 0)
    total = sum(env.step(m)[1] for m in env.shortest_path_actions())
    assert (total, env.won, env.turn) == (1.0, True, 12)
