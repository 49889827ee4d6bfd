"""FrozenLake as a text environment: the revisit-heavy benchmark for GiGPO's anchor-state grouping.

Maps are gymnasium's procedural FrozenLake maps (``generate_random_map(size, p, seed=map_id)``, which only
returns maps with a path from start to goal); the dynamics are implemented here on the grid.

Observation: the grid, one row per line, cells separated by a space::

    P _ _ _
    O O _ _
    _ O O _
    O _ _ G

``P`` the player, ``_`` frozen ice (safe, the start cell included), ``O`` a hole, ``G`` the goal. The
observation carries no turn counter, so revisiting a cell gives an identical observation (and anchor).

Actions: ``up``, ``down``, ``left``, ``right`` (case and surrounding whitespace ignored). Moving off the
grid leaves the player in place (valid action, reward 0). Anything else is invalid: state unchanged,
reward 0, ``info["action_valid"] = False``. Stepping into a hole ends the episode with reward 0;
reaching ``G`` ends it with ``success_reward`` and ``info["won"] = True``. After ``max_turns`` steps the
episode is cut (``done=True``, ``info["truncated"] = True``).

Tasks: a task is an integer map id (the seed of ``generate_random_map``). ``tasks("train")`` holds map ids
``0 .. 9999``, ``tasks("eval")`` map ids ``1_000_000 .. 1_000_499``; the id ranges are disjoint, but for
small maps two ids can produce the same layout (there are few distinct solvable 4x4 maps).
"""

from __future__ import annotations

import random
from collections import deque
from functools import lru_cache
from typing import Any

from .base import TextEnv, parse_move, seed_tasks

ACTIONS: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ACTION_NAMES: list[str] = list(ACTIONS)

TRAIN_IDS = range(0, 10_000)
EVAL_IDS = range(1_000_000, 1_000_500)

SYSTEM_PROMPT = (
    "You are an expert player of FrozenLake, a grid puzzle. You move one cell per turn. Each turn, first reason "
    "briefly inside <think> </think>, then give exactly one move inside <action> </action>: up, down, left "
    "or right."
)

PROMPT_TEMPLATE = (
    "{instruction}\n"
    "Map symbols: P = you, _ = frozen ice (safe), O = hole (falling in ends the game), G = goal. Rows run top to "
    "bottom; 'up' moves one row up. Walking off the edge of the map leaves you where you are.\n"
    "{history}"
    "Turn {turn} of {max_turns}. Current map:\n{observation}\n"
    "{admissible_actions}"
    "Think about a safe route inside <think> </think>, then answer with one move inside <action> </action>, "
    "for example <action>down</action>."
)

INSTRUCTION = "Walk across the frozen lake from your position P to the goal G without stepping into a hole O."


@lru_cache(maxsize=4096)
def generate_map(map_id: int, size: int = 4, p: float = 0.8) -> tuple[str, ...]:
    """The map of ``map_id``: rows of ``S`` (start), ``F`` (frozen), ``H`` (hole), ``G`` (goal)."""
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    return tuple(generate_random_map(size=size, p=p, seed=int(map_id)))


class FrozenLakeEnv(TextEnv):
    """Text FrozenLake on gymnasium's procedural maps.

    Args:
        size (`int`, defaults to 4): side length of the square map.
        p (`float`, defaults to 0.8): probability that a cell is frozen (not a hole).
        is_slippery (`bool`, defaults to `False`): with ``True``, a move goes in the intended direction with
            probability 1/3 and in each perpendicular direction with 1/3 (gymnasium's rule), drawn from an
            RNG seeded by ``reset``'s ``seed``.
        success_reward (`float`, defaults to 1.0): reward for reaching the goal.
        max_turns (`int`, *optional*): turn limit; defaults to ``2 * (size - 1) + 4`` (10 for 4x4).

    Example::

        env = FrozenLakeEnv()
        obs, info = env.reset(task=3, seed=3)
        for move in env.shortest_path_actions():
            obs, reward, done, info = env.step(move)
        assert info["won"] and reward == 1.0
    """

    name = "frozenlake"
    system_prompt = SYSTEM_PROMPT
    prompt_template = PROMPT_TEMPLATE
    invalid_action = "<invalid>"

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        success_reward: float = 1.0,
        max_turns: int | None = None,
    ):
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if not 0.0 < p <= 1.0:
            raise ValueError(f"p must be in (0, 1], got {p}")
        self.size = int(size)
        self.p = float(p)
        self.is_slippery = bool(is_slippery)
        self.success_reward = float(success_reward)
        self.max_turns = int(max_turns) if max_turns is not None else 2 * (self.size - 1) + 4
        self.task_type = f"{self.size}x{self.size}"
        self.grid: tuple[str, ...] = ()
        self.pos: tuple[int, int] = (0, 0)
        self.done = True
        self.won = False
        self.turn = 0
        self.task: Any = None
        self._rng = random.Random(0)

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Any = None, seed: int | None = None) -> tuple[str, dict]:
        map_id = task if task is not None else (seed if seed is not None else 0)
        self.task = int(map_id)
        self.grid = generate_map(self.task, self.size, self.p)
        self.pos = next((r, c) for r, row in enumerate(self.grid) for c, ch in enumerate(row) if ch == "S")
        self.done = False
        self.won = False
        self.turn = 0
        self._rng = random.Random(seed if seed is not None else self.task)
        return self.render(), self._info(instruction=INSTRUCTION)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        move = parse_move(action)
        if self.done:
            return self.render(), 0.0, True, self._info(action_valid=move is not None)
        self.turn += 1
        reward = 0.0
        if move is not None:
            if self.is_slippery:
                move = self._slip(move)
            self.pos = self._moved(self.pos, move)
            cell = self.grid[self.pos[0]][self.pos[1]]
            if cell == "H":
                self.done = True
            elif cell == "G":
                self.done = self.won = True
                reward = self.success_reward
        truncated = not self.done and self.turn >= self.max_turns
        if truncated:
            self.done = True
        return self.render(), reward, self.done, self._info(action_valid=move is not None, truncated=truncated)

    def tasks(self, split: str = "train"):
        return seed_tasks(split, {"train": TRAIN_IDS, "eval": EVAL_IDS, "test": EVAL_IDS}, self.task_type, self.name)

    # ------------------------------------------------------------------ helpers
    def render(self) -> str:
        """The observation: the grid with ``P`` at the player's cell."""
        rows = []
        for r, row in enumerate(self.grid):
            cells = []
            for c, ch in enumerate(row):
                if (r, c) == self.pos:
                    cells.append("P")
                else:
                    cells.append({"S": "_", "F": "_", "H": "O", "G": "G"}[ch])
            rows.append(" ".join(cells))
        return "\n".join(rows)

    def shortest_path_actions(self) -> list[str] | None:
        """Moves of a shortest hole-free path from the current position to the goal (BFS), ``None`` if none."""
        if not self.grid:
            return None
        prev: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {self.pos: None}
        queue = deque([self.pos])
        while queue:
            cur = queue.popleft()
            if self.grid[cur[0]][cur[1]] == "G":
                path = []
                while prev[cur] is not None:
                    cur, move = prev[cur]  # type: ignore[misc]
                    path.append(move)
                return path[::-1]
            if self.grid[cur[0]][cur[1]] == "H":
                continue
            for move in ACTION_NAMES:
                nxt = self._moved(cur, move)
                if nxt not in prev:
                    prev[nxt] = (cur, move)
                    queue.append(nxt)
        return None

    def expert_action(self) -> str:
        """First move of a shortest path to the goal (``up`` if there is none)."""
        path = self.shortest_path_actions()
        return path[0] if path else "up"

    def _moved(self, pos: tuple[int, int], move: str) -> tuple[int, int]:
        dr, dc = ACTIONS[move]
        r, c = pos[0] + dr, pos[1] + dc
        if 0 <= r < self.size and 0 <= c < self.size:
            return (r, c)
        return pos

    def _slip(self, move: str) -> str:
        dr, dc = ACTIONS[move]
        perpendicular = [m for m, (r, c) in ACTIONS.items() if r * dr + c * dc == 0]
        return self._rng.choice([move, *perpendicular])

    def _info(self, **extra: Any) -> dict:
        info = {
            "admissible_actions": list(ACTION_NAMES),
            "won": self.won,
            "task_type": self.task_type,
            "task": self.task,
            "position": self.pos,
            "turn": self.turn,
        }
        info.update(extra)
        return info
