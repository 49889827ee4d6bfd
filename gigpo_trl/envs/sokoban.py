"""Sokoban as a text environment, with a small procedural level generator of its own.

Observation: the room, one row per line, cells separated by a space::

    # # # # # #
    # _ _ # _ #
    # _ X _ _ #
    # _ P O _ #
    # _ _ _ _ #
    # # # # # #

Symbols: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``√`` box on a target, ``P`` player, ``S`` player
standing on a target. There is no turn counter in the observation.

Actions: ``up``, ``down``, ``left``, ``right`` (case and surrounding whitespace ignored). The player walks
onto free floor; walking into a box pushes it one cell if the cell behind it is free floor or a target
(never into a wall or another box). A blocked move leaves the state unchanged and is still a valid action.
Anything else is invalid: state unchanged, reward 0, ``info["action_valid"] = False``.

Reward: ``success_reward`` when every box stands on a target (``done``, ``info["won"] = True``), otherwise
``-step_penalty`` (0 by default). The episode is cut after ``max_turns`` steps.

Levels: ``generate_level(level_id)`` builds a room from ``random.Random(level_id)``: a walled rectangle with a
few random interior walls (the floor kept connected), targets with the boxes on them, then the level is
*reverse played*: the player walks around and pulls boxes away from the targets. Every pull undoes a push,
so the reached state is solvable by construction; states with all boxes on targets are rejected, and the
result is checked with the BFS solver (``solve``). A task is an integer level id; ``reset`` also accepts a
level written as text (the observation format, spaces optional), which tests use.

The GiGPO paper's text Sokoban (its rendering, action ids and gym-sokoban's rewards) is
:class:`gigpo_trl.envs.verl_agent.sokoban.PaperSokobanEnv`.
"""

from __future__ import annotations

import random
from collections import deque
from functools import lru_cache
from typing import Any, NamedTuple

from .base import TextEnv, parse_move, seed_tasks

MOVES: dict[str, tuple[int, int]] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
ACTION_NAMES: list[str] = list(MOVES)

TRAIN_IDS = range(0, 10_000)
EVAL_IDS = range(1_000_000, 1_000_500)

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"

SYSTEM_PROMPT = (
    "You are an expert Sokoban player. You move one cell per turn and can push (never pull) a box by walking "
    "into it. Each turn, first reason briefly inside <think> </think>, then give exactly one move inside "
    "<action> </action>: up, down, left or right."
)

PROMPT_TEMPLATE = (
    "{instruction}\n"
    "Symbols: # = wall, _ = floor, O = target, X = box, √ = box on a target, P = you, S = you on a target. "
    "Walking into a box pushes it one cell if the cell behind it is free; a box pushed into a corner can no "
    "longer be moved out of it.\n"
    "{history}"
    "Turn {turn} of {max_turns}. Current room:\n{observation}\n"
    "{admissible_actions}"
    "Plan your pushes inside <think> </think>, then answer with one move inside <action> </action>, for "
    "example <action>left</action>."
)

INSTRUCTION = "Push every box X onto a target O."

class Level(NamedTuple):
    """A Sokoban state. ``walls``: frozenset of (row, col); ``targets``/``boxes``: frozensets; ``player``."""

    height: int
    width: int
    walls: frozenset
    targets: frozenset
    boxes: frozenset
    player: tuple[int, int]


def parse_level(text: str) -> Level:
    """Parse a level written in the observation format (cells separated by spaces or not)."""
    rows = []
    for line in text.strip("\n").splitlines():
        if not line.strip():
            continue
        tokens = line.split()
        cells = tokens if all(len(t) == 1 for t in tokens) and len(tokens) > 1 else list("".join(tokens))
        rows.append(cells)
    if not rows:
        raise ValueError("empty Sokoban level")
    height, width = len(rows), max(len(r) for r in rows)
    walls, targets, boxes, players = set(), set(), set(), []
    for r, row in enumerate(rows):
        row = row + [WALL] * (width - len(row))
        for c, ch in enumerate(row):
            pos = (r, c)
            if ch == WALL:
                walls.add(pos)
            elif ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET, "*"):
                targets.add(pos)
            elif ch not in (FLOOR, BOX, PLAYER, " ", "."):
                raise ValueError(f"unknown Sokoban symbol {ch!r} at row {r}, column {c}")
            if ch in (BOX, BOX_ON_TARGET, "*"):
                boxes.add(pos)
            if ch in (PLAYER, PLAYER_ON_TARGET):
                players.append(pos)
    if len(players) != 1:
        raise ValueError(f"a Sokoban level needs exactly one player, found {len(players)}")
    if len(boxes) != len(targets) or not boxes:
        raise ValueError(f"a Sokoban level needs as many boxes as targets (>0), got {len(boxes)} and {len(targets)}")
    return Level(height, width, frozenset(walls), frozenset(targets), frozenset(boxes), players[0])


def render_level(level: Level) -> str:
    """The observation text of ``level``."""
    rows = []
    for r in range(level.height):
        cells = []
        for c in range(level.width):
            pos = (r, c)
            if pos in level.walls:
                ch = WALL
            elif pos == level.player:
                ch = PLAYER_ON_TARGET if pos in level.targets else PLAYER
            elif pos in level.boxes:
                ch = BOX_ON_TARGET if pos in level.targets else BOX
            elif pos in level.targets:
                ch = TARGET
            else:
                ch = FLOOR
            cells.append(ch)
        rows.append(" ".join(cells))
    return "\n".join(rows)


def apply_move(level: Level, move: str) -> Level:
    """The level after ``move`` (walk or push); unchanged if the move is blocked."""
    dr, dc = MOVES[move]
    nxt = (level.player[0] + dr, level.player[1] + dc)
    if nxt in level.walls:
        return level
    if nxt in level.boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in level.walls or beyond in level.boxes:
            return level
        return level._replace(boxes=(level.boxes - {nxt}) | {beyond}, player=nxt)
    return level._replace(player=nxt)


def is_solved(level: Level) -> bool:
    return level.boxes == level.targets


def solve(level: Level, max_states: int = 200_000) -> list[str] | None:
    """Shortest move sequence solving ``level`` (BFS over player and box positions); ``None`` if unsolvable
    (or more than ``max_states`` states were explored)."""
    start = (level.player, level.boxes)
    prev: dict[Any, Any] = {start: None}
    queue = deque([level])
    while queue:
        cur = queue.popleft()
        if is_solved(cur):
            path, key = [], (cur.player, cur.boxes)
            while prev[key] is not None:
                key, move = prev[key]
                path.append(move)
            return path[::-1]
        if len(prev) > max_states:
            return None
        for move in ACTION_NAMES:
            nxt = apply_move(cur, move)
            key = (nxt.player, nxt.boxes)
            if key not in prev:
                prev[key] = ((cur.player, cur.boxes), move)
                queue.append(nxt)
    return None


def _connected(floor: set) -> bool:
    if not floor:
        return False
    start = next(iter(floor))
    seen, stack = {start}, [start]
    while stack:
        r, c = stack.pop()
        for dr, dc in MOVES.values():
            n = (r + dr, c + dc)
            if n in floor and n not in seen:
                seen.add(n)
                stack.append(n)
    return len(seen) == len(floor)


@lru_cache(maxsize=4096)
def generate_level(
    level_id: int,
    height: int = 6,
    width: int = 6,
    num_boxes: int = 1,
    max_interior_walls: int = 2,
    num_reverse_steps: int = 40,
    max_solution_length: int | None = 15,
    min_solution_length: int = 2,
) -> Level:
    """Procedural level for ``level_id`` (deterministic): random room, boxes on targets, reverse play.

    The returned level is solvable (checked with ``solve``), not solved at the start, its shortest solution
    has at least ``min_solution_length`` moves and, if ``max_solution_length`` is set, at most that many.
    """
    rng = random.Random(int(level_id))
    interior = [(r, c) for r in range(1, height - 1) for c in range(1, width - 1)]
    border = {(r, c) for r in range(height) for c in range(width)} - set(interior)
    if len(interior) < num_boxes + 2:
        raise ValueError(f"a {height}x{width} room is too small for {num_boxes} boxes")
    for _attempt in range(1000):
        floor = set(interior)
        for cell in rng.sample(interior, rng.randint(0, max_interior_walls)):
            if _connected(floor - {cell}):
                floor.discard(cell)
        walls = frozenset(border | (set(interior) - floor))
        free = sorted(floor)
        targets = frozenset(rng.sample(free, num_boxes))
        player = rng.choice([p for p in free if p not in targets])
        state = Level(height, width, walls, targets, targets, player)
        # Reverse play: moves and pulls. Keep the visited state whose boxes are farthest from the targets.
        best, best_score = None, 0
        for _ in range(num_reverse_steps):
            state = _reverse_step(state, rng)
            score = sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in targets) for b in state.boxes)
            if not is_solved(state) and score >= best_score and score > 0:
                best, best_score = state, score
        if best is None:
            continue
        solution = solve(best)
        if solution is None or len(solution) < max(1, min_solution_length):
            continue  # None cannot happen for reverse-played states; kept as a guard
        if max_solution_length is not None and len(solution) > max_solution_length:
            continue
        return best
    raise RuntimeError(f"could not generate a Sokoban level for id {level_id}")


def _reverse_step(state: Level, rng: random.Random) -> Level:
    """One random reverse move: walk, or walk away from an adjacent box pulling it along."""
    moves = ACTION_NAMES[:]
    rng.shuffle(moves)
    blocked = state.walls | state.boxes
    for move in moves:
        dr, dc = MOVES[move]
        nxt = (state.player[0] + dr, state.player[1] + dc)
        if nxt in blocked:
            continue
        behind = (state.player[0] - dr, state.player[1] - dc)
        if behind in state.boxes and rng.random() < 0.7:
            return state._replace(boxes=(state.boxes - {behind}) | {state.player}, player=nxt)
        return state._replace(player=nxt)
    return state


class SokobanEnv(TextEnv):
    """Text Sokoban on procedurally generated rooms (default 6x6 including walls, one box).

    Args:
        dim_room (`tuple[int, int]`, defaults to `(6, 6)`): room height and width, walls included.
        num_boxes (`int`, defaults to 1): boxes (and targets) per level.
        success_reward (`float`, defaults to 1.0): reward when all boxes are on targets.
        step_penalty (`float`, defaults to 0.0): subtracted from the reward of every other step.
        max_turns (`int`, defaults to 15): turn limit; generated levels are solvable within it.
        prompt_template (`str`, *optional*): the user-message template, verbatim.

    Example::

        env = SokobanEnv()
        obs, info = env.reset(task=7, seed=7)
        for move in env.solution():
            obs, reward, done, info = env.step(move)
        assert info["won"]
    """

    name = "sokoban"
    system_prompt = SYSTEM_PROMPT
    prompt_template = PROMPT_TEMPLATE
    invalid_action = "<invalid>"

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        success_reward: float = 1.0,
        step_penalty: float = 0.0,
        max_turns: int = 15,
        prompt_template: str | None = None,
    ):
        if prompt_template is not None:
            self.prompt_template = prompt_template
        self.dim_room = (int(dim_room[0]), int(dim_room[1]))
        self.num_boxes = int(num_boxes)
        self.success_reward = float(success_reward)
        self.step_penalty = float(step_penalty)
        self.max_turns = int(max_turns)
        self.task_type = f"{self.dim_room[0]}x{self.dim_room[1]}-{self.num_boxes}box"
        self.level: Level | None = None
        self.task: Any = None
        self.done = True
        self.won = False
        self.turn = 0

    def reset(self, task: Any = None, seed: int | None = None) -> tuple[str, dict]:
        if isinstance(task, str) and not task.strip().lstrip("-").isdigit():
            self.level = parse_level(task)
            self.task = task
        else:
            level_id = int(task) if task is not None else (seed if seed is not None else 0)
            self.task = level_id
            self.level = generate_level(
                level_id, self.dim_room[0], self.dim_room[1], self.num_boxes, max_solution_length=self.max_turns
            )
        self.done = False
        self.won = False
        self.turn = 0
        return self.render(), self._info(instruction=INSTRUCTION)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.level is None:
            raise RuntimeError(f"{type(self).__name__}.step called before reset")
        move = parse_move(action)
        if self.done:
            return render_level(self.level), 0.0, True, self._info(action_valid=move is not None)
        self.turn += 1
        if move is not None:
            self.level = apply_move(self.level, move)
        reward = -self.step_penalty
        if is_solved(self.level):
            self.done = self.won = True
            reward = self.success_reward
        truncated = not self.done and self.turn >= self.max_turns
        if truncated:
            self.done = True
        info = self._info(action_valid=move is not None, truncated=truncated)
        return render_level(self.level), reward, self.done, info

    def tasks(self, split: str = "train"):
        return seed_tasks(split, {"train": TRAIN_IDS, "eval": EVAL_IDS, "test": EVAL_IDS}, self.task_type, self.name)

    def render(self) -> str:
        if self.level is None:
            return ""
        return render_level(self.level)

    def solution(self) -> list[str] | None:
        """Shortest move sequence from the current state (BFS), ``None`` if the level is now unsolvable."""
        return solve(self.level) if self.level is not None else None

    def expert_action(self) -> str:
        path = self.solution()
        return path[0] if path else "up"

    def _info(self, **extra: Any) -> dict:
        info = {
            "admissible_actions": list(ACTION_NAMES),
            "won": self.won,
            "task_type": self.task_type,
            "task": self.task,
            "turn": self.turn,
        }
        info.update(extra)
        return info
