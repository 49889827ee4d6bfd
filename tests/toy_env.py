"""A small deterministic environment for the collector and trainer tests.

LineWalkEnv: positions 0..length-1, start position = seed % (length - 1), goal at length - 1. The move is decided
by the action text so that a random policy still produces varied, reproducible trajectories: "right" → +1,
"left" → -1, any other text → +1 if its length is even else -1. Reward 1 on reaching the goal (done). The
observation has no turn counter, so revisited positions repeat the same anchor state.
"""

from __future__ import annotations

import datasets

from gigpo_trl.envs.base import TextEnv


class LineWalkEnv(TextEnv):
    name = "corridor"
    invalid_action = "stay"  # the collector sends this for unparsable completions

    def __init__(self, length: int = 4, obs_padding: int = 0):
        self.length = length
        self.obs_padding = obs_padding  # extra characters per observation, to size prompts in tests

    def _obs(self) -> str:
        return f"You are at position {self.pos} of a corridor of length {self.length}." + " ." * self.obs_padding

    def reset(self, task, seed=None):
        self.length = int(task)
        self.pos = (seed or 0) % (self.length - 1)
        return self._obs(), {"instruction": "reach the end of the corridor", "admissible_actions": ["left", "right"],
                             "task_type": f"len{self.length}"}

    def step(self, action):
        action = action.strip().lower()
        if action == "stay":
            move = 0
        elif action in ("left", "right"):
            move = 1 if action == "right" else -1
        else:
            move = 1 if len(action) % 2 == 0 else -1
        self.pos = min(max(self.pos + move, 0), self.length - 1)
        done = self.pos == self.length - 1
        return self._obs(), float(done), done, {"admissible_actions": ["left", "right"], "won": done}

    def tasks(self, split="train"):
        if split not in ("train", "eval"):
            raise ValueError(f"unknown split {split!r}")
        base = 0 if split == "train" else 100
        return datasets.Dataset.from_dict({"task": [3, 4, 5, 6] * 4, "seed": [base + i for i in range(16)]})


class JitteryWalkEnv(LineWalkEnv):
    """LineWalkEnv whose every step takes a random 0-``max_delay`` seconds (drawn from the episode's seed and turn, so
    environments answer in another order than they were asked), and whose step raises at turn ``fail_turn`` of the
    episode with seed ``fail_seed``: for the independently stepped episodes of tests/test_concurrent_rollout.py."""

    def __init__(self, max_delay: float = 0.03, fail_seed: int | None = None, fail_turn: int = 1):
        super().__init__()
        self.max_delay, self.fail_seed, self.fail_turn = max_delay, fail_seed, fail_turn

    def reset(self, task, seed=None):
        self.seed, self.turn = seed, 0
        return super().reset(task, seed)

    def step(self, action):
        import random
        import time

        time.sleep(random.Random(f"{self.seed}:{self.turn}").uniform(0.0, self.max_delay))
        self.turn += 1
        if self.seed == self.fail_seed and self.turn == self.fail_turn + 1:
            raise RuntimeError("simulated crash in step")
        return super().step(action)


class NoisyLineWalkEnv(LineWalkEnv):
    """LineWalkEnv whose unparsable completions reach step() as raw text (invalid_action=None), so a random
    policy moves by the parity of its text length: varied returns for the trainer tests."""

    invalid_action = None


class ExpertLineWalkEnv(NoisyLineWalkEnv):
    """NoisyLineWalkEnv with an expert (``right`` always reaches the goal): an environment the warm-up can run on."""

    def expert_action(self) -> str:
        return "right"


class FixedLengthEnv(LineWalkEnv):
    """Every episode lasts exactly ``task`` turns whatever the actions (reward 1 at the end): fixes the number of
    rows each task yields, for the multi-process tests."""

    def reset(self, task, seed=None):
        self.remaining = int(task)
        return f"{self.remaining} turns left", {"instruction": "wait", "admissible_actions": ["wait"]}

    def step(self, action):
        self.remaining -= 1
        done = self.remaining == 0
        return f"{self.remaining} turns left", float(done), done, {"won": done}

    def tasks(self, split="train"):
        return datasets.Dataset.from_dict({"task": [1, 3, 2, 4], "seed": [0, 0, 0, 0]})


class LongObsAtTurn3Env(FixedLengthEnv):
    """FixedLengthEnv whose task-4 episodes answer their third step with a 3,000-character observation: the prompt
    of turn 3 cannot fit a small ``max_prompt_length``, on the rank that rolls out task 4 only."""

    def step(self, action):
        obs, reward, done, info = super().step(action)
        return (obs + " ." * 1500 if self.task_length == 4 and self.remaining == 1 else obs), reward, done, info

    def reset(self, task, seed=None):
        self.task_length = int(task)
        return super().reset(task, seed)


class FaultyEnv(FixedLengthEnv):
    """FixedLengthEnv that misbehaves on command, for the fault tests (tests/test_faults.py).

    ``step`` reacts to the action text: ``"raise"`` raises, ``"nan"`` returns a NaN reward, ``"huge"`` a reward of
    1e308 (two of them make an infinite return), ``"hang"`` sleeps for a
    minute (past any test's ``env_step_timeout``), ``"die"`` kills the process it runs in (only ever send it to an
    env in a worker process). ``reset`` raises on the calls whose ordinal (counted per process, from 1) is in the
    class attribute ``fail_resets``: a transient failure of one group member.
    """

    fail_resets: frozenset = frozenset()
    reset_calls = 0

    def reset(self, task, seed=None):
        type(self).reset_calls += 1
        if type(self).reset_calls in type(self).fail_resets:
            raise ConnectionError(f"simulated transient failure in reset #{type(self).reset_calls}")
        return super().reset(task, seed)

    def step(self, action):
        import math
        import os
        import time

        if action == "raise":
            raise RuntimeError("simulated crash in step")
        if action == "hang":
            time.sleep(60)
        if action == "die":
            os._exit(3)
        obs, reward, done, info = super().step(action)
        if action == "huge":  # finite, but two of them overflow a float64 return
            reward = 1e308
        return obs, math.nan if action == "nan" else reward, done, info


class SiteError(Exception):
    """An exception whose class needs two constructor arguments: it pickles (as ``SiteError(message)``) but does not
    unpickle, as many libraries' own exceptions."""

    def __init__(self, site, detail):
        super().__init__(f"{site}: {detail}")
        self.site, self.detail = site, detail


class SiteFaultEnv(FixedLengthEnv):
    """FixedLengthEnv whose step on the action ``"site"`` returns ``info["error"] = SiteError(...)``: fine in process,
    a value the trainer cannot receive from an env worker."""

    def step(self, action):
        obs, reward, done, info = super().step(action)
        if action == "site":
            info = {**info, "error": SiteError("shop", "closed")}
        return obs, reward, done, info


class LostExpertEnv(FixedLengthEnv):
    """FixedLengthEnv with an expert (always "wait") that loses its map: on task 2 at turn 1 and on task 5 at turn 0,
    its ``expert_action()`` raises KeyError while the environment itself is fine."""

    def reset(self, task, seed=None):
        self.turn, self.task_length = 0, int(task)
        return super().reset(task, seed)

    def step(self, action):
        self.turn += 1
        return super().step(action)

    def expert_action(self):
        if (self.task_length, self.turn) in ((2, 1), (5, 0)):
            raise KeyError("expert lost its map")
        return "wait"


class ActorReportingWalkEnv(LineWalkEnv):
    """LineWalkEnv with an expert (always "right") whose observations say whether they were computed inside a Ray
    actor (the Ray warm-up test)."""

    def _obs(self) -> str:
        return super()._obs() + f" Ray actor: {_in_ray_actor()}."

    def expert_action(self) -> str:
        return "right"


def _in_ray_actor() -> bool:
    import sys

    if "ray" not in sys.modules:  # a process that never imported Ray is no Ray actor
        return False
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


class SlowStepEnv(FixedLengthEnv):
    """:class:`FixedLengthEnv` whose every step takes a random ``delay = (low, high)`` seconds (uniform, seeded by
    the episode's seed): a tool or web environment's latency, for the asynchronous-rollout benchmark."""

    def __init__(self, delay: tuple[float, float] = (0.2, 1.0)):
        super().__init__()
        self.delay = delay

    def reset(self, task, seed=None):
        import random

        self._rng = random.Random(seed)
        return super().reset(task, seed)

    def step(self, action):
        import time

        time.sleep(self._rng.uniform(*self.delay))
        return super().step(action)
