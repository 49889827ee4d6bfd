"""The learning benchmark's testbed (benchmarks/learning.py): DoorCorridor names doors instead of directions but
must stay CorridorEnv underneath (same observations, rewards, anchors), and must not leak which door leads on."""

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import learning  # noqa: E402  (benchmarks/learning.py)

from gigpo_trl.envs.corridor import CorridorEnv  # noqa: E402


def make():
    return learning.DoorCorridor(length=12, max_turns=30, directions=2)


def test_door_actions_on_task_5_by_hand():
    env = make()
    obs, info = env.reset(task=5)
    assert obs == "room 1: left arch, right closet"
    assert info["admissible_actions"] == ["arch", "closet"] == env.legal_moves()
    assert env.expert_action() == "arch"
    obs, reward, done, info = env.step("closet")
    assert (obs, reward, done, info["action_valid"]) == ("closet off room 1: left way out", 0.0, False, True)
    assert env.legal_moves() == ["back"]
    obs, _, _, info = env.step(" Back ")
    assert obs == "room 1: left arch, right closet" and info["action_valid"]
    for bad in ("up", "left", "stairs", "back", ""):  # a direction, a door not in this room, no dead end here
        obs, reward, done, info = env.step(bad)
        assert (obs, reward, done, info["action_valid"]) == ("room 1: left arch, right closet", 0.0, False, False)
    assert env.turn == 7


def test_expert_doors_finish_in_12_turns_with_reward_1():
    env = make()
    env.reset(task=123)
    total, turns = 0.0, 0
    while not env.done:
        _, reward, _, _ = env.step(env.expert_action())
        total, turns = total + reward, turns + 1
    assert (total, turns, env.won) == (1.0, 12, True)


def test_same_observations_rewards_and_anchors_as_corridor_env():
    rng = random.Random(0)
    for task in range(20):
        door_env, base = make(), CorridorEnv(length=12, max_turns=30, directions=2)
        assert door_env.reset(task=task)[0] == base.reset(task=task)[0]
        while not door_env.done:
            choices = door_env.legal_moves() + ["vault"]
            door = rng.choice(choices)
            move = door_env._door_moves().get(door, "<invalid>")
            a = door_env.step(door)
            b = base.step(move)
            assert a[:3] == b[:3] and a[3]["action_valid"] == b[3]["action_valid"]
            assert door_env.anchor_state(a[0]) == base.anchor_state(b[0])
        assert base.done


def test_listed_doors_follow_the_observation_not_the_passage():
    # The passage is listed first exactly where it is the left door (the observation's order), i.e. the order
    # says nothing about which door leads on.
    env = make()
    first_is_passage = left_passages = 0
    for task in range(300):
        env.reset(task=task)
        first_is_passage += env.legal_moves()[0] == env.expert_action()
        left_passages += env.rooms[0].passage == "left"
    assert first_is_passage == left_passages
    assert 100 < left_passages < 200
