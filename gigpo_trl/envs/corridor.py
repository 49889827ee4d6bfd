"""Dead-end corridor: a long, sparse-reward text env where step-level credit matters (the learning testbed).

The agent walks through ``length`` rooms, one after another, to the exit behind the last room. Every room has
two doors, in two of the four directions; the other two directions are walls. One door, a *passage*, leads on
to the next room (one-way: the door locks behind you); the other leads into a *dead end*, a closet with no
other exit, from which the only way on is back out the way you came. Each door is described by its kind, so a
policy that reads the description can always take the passage; one that picks a door at random wastes two
turns per wrong door (in and out). Which direction holds which door is drawn per room from the task id, so a
policy cannot memorise directions, only learn which door kinds lead on.

Observation (no turn counter, so revisiting a state gives an identical observation and anchor): the doors
in sight, in the order up, down, left, right; the directions not named are walls::

    room 3: down arch, left closet        # in a room: its two doors and their kinds
    closet off room 3: right way out      # inside a dead end

With ``directions=2`` (the learning benchmark's setting) the two doors of every room are on the left and the
right, so the legal moves are always ``left``/``right`` in a room and the one way out in a dead end; the side of
the passage is still drawn per room. A uniformly random choice between the doors succeeds within 30 turns with
probability 0.332 (at most 9 wrong doors).

Door kinds: passages are one of ``PASSAGES`` (``arch``, ``stairs``), dead ends one of ``DEAD_ENDS``
(``closet``, ``niche``); the kind of each door is drawn per room too. The way out of a dead end is the
direction opposite to the one that led in.

Actions: ``up``, ``down``, ``left``, ``right`` (case and surrounding whitespace ignored). Walking into a wall
leaves the state unchanged and is a valid action (as FrozenLake's edge). Anything else is invalid: state
unchanged, reward 0, ``info["action_valid"] = False``. ``legal_moves()`` lists the moves that are not walls
(the rules of the game, not the way to the exit).

Reward: ``success_reward`` for the move through the last room's passage (``done``, ``info["won"] = True``),
0 otherwise. The shortest episode takes ``length`` turns (12 by default); a uniformly random choice between
the two doors of a room succeeds within ``max_turns`` = 2 * ``length`` turns with probability 0.12 (negative
binomial: at most ``length / 2`` wrong doors over ``length`` rooms). After ``max_turns`` turns the episode is
cut (``done=True``, ``info["truncated"] = True``).

Options for the learning benchmark's map (all off by default, so the defaults above are unchanged):

- ``nuisance``: a second observation line that carries no information about the state, as many real
  environments show. ``"turn"``: ``turn T`` (the turns taken so far: the same place reached after a different
  number of turns no longer gives the same observation); ``"clock"``: ``clock C``, where ``C`` is the next value of
  the environment's ``clock`` (an iterator of ints, counting from 1 by default): environments given one shared
  counter never show two identical observations, so exact anchors never match.
- ``anchor_drops_nuisance``: ``anchor_state()`` returns the observation without the nuisance line (the remedy a
  user with such an environment can write); without it the anchor is the observation.
- ``trap_door``: in one room per task (``trap_room``, drawn from the task id), the dead-end door is a trap door:
  walking through it ends the episode at once with reward 0 (``info["trapped"] = True``). It reads like any
  dead end (``closet``/``niche``), so avoiding it is the same skill as avoiding dead ends, but the mistake is
  local and irreversible instead of costing two turns.

Tasks: a task is an integer id, the seed of the room layout (``generate_corridor``). ``tasks("train")`` holds
ids ``0 .. 9999``, ``tasks("eval")`` (= ``"test"``) ids ``1_000_000 .. 1_000_499``. With 4 * 3 * 2 * 2 = 48
layouts per room, two ids give the same 12-room corridor with probability 48**-12; ``tests/test_corridor.py``
checks that no eval layout occurs in the train split.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from functools import lru_cache
from typing import Any, NamedTuple

from .base import TextEnv, parse_move, seed_tasks

MOVES = ("up", "down", "left", "right")
OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}
PASSAGES = ("arch", "stairs")
DEAD_ENDS = ("closet", "niche")

TRAIN_IDS = range(0, 10_000)
EVAL_IDS = range(1_000_000, 1_000_500)

SYSTEM_PROMPT = (
    "You are exploring a building, room after room, to find the exit. Each turn, first reason briefly inside "
    "<think> </think>, then give exactly one move inside <action> </action>: up, down, left or right."
)

PROMPT_TEMPLATE = (
    "{instruction}\n"
    "Each room has two doors: one leads on to the next room, the other into a dead end you must walk back "
    "out of. Doors lock behind you. Walking into a wall leaves you where you are.\n"
    "{history}"
    "Turn {turn} of {max_turns}. You see:\n{observation}\n"
    "{admissible_actions}"
    "Think about which door leads on inside <think> </think>, then answer with one move inside "
    "<action> </action>, for example <action>up</action>."
)

INSTRUCTION = "Walk through every room to the exit behind the last one."

NUISANCES = ("turn", "clock")


def trap_room(task_id: int, length: int) -> int:
    """Index (0-based) of the room whose dead end is a trap door in corridor ``task_id`` with ``trap_door=True``,
    drawn from ``random.Random(f"trap-{length}-{task_id}")``."""
    return random.Random(f"trap-{length}-{int(task_id)}").randrange(length)


class Room(NamedTuple):
    """One room: the direction and kind of its passage and of its dead-end door."""

    passage: str
    passage_kind: str
    dead_end: str
    dead_end_kind: str


@lru_cache(maxsize=8192)
def generate_corridor(task_id: int, length: int = 12, directions: int = 4) -> tuple[Room, ...]:
    """The rooms of corridor ``task_id``: per room, two distinct directions (passage, dead end; among all four
    moves, or ``left``/``right`` when ``directions == 2``) and door kinds, drawn from
    ``random.Random(f"corridor-{length}-{task_id}")`` (``"corridor2-..."`` for two directions)."""
    prefix = "corridor" if directions == 4 else "corridor2"
    rng = random.Random(f"{prefix}-{length}-{int(task_id)}")
    pool = MOVES if directions == 4 else ("left", "right")
    rooms = []
    for _ in range(length):
        passage, dead_end = rng.sample(pool, 2)
        rooms.append(Room(passage, rng.choice(PASSAGES), dead_end, rng.choice(DEAD_ENDS)))
    return tuple(rooms)


class CorridorEnv(TextEnv):
    """Rooms in a row, each with a passage and a dead end; reward only for walking out of the last room.

    Args:
        length (`int`, defaults to 12): number of rooms, the length of the shortest episode. At least 1.
        directions (`int`, defaults to 4): ``4``: the two doors of a room lie in two of the four directions;
            ``2``: always one on the left and one on the right (up and down are walls everywhere), so a legal
            move never needs more than reading which of ``left``/``right`` the observation names.
        success_reward (`float`, defaults to 1.0): reward for leaving the last room.
        max_turns (`int`, *optional*): turn limit; defaults to ``2 * length``.
        nuisance (`str`, *optional*): ``None`` (default), ``"turn"`` or ``"clock"``: a second observation line
            that never helps (module doc).
        anchor_drops_nuisance (`bool`, defaults to `False`): ``anchor_state()`` drops the nuisance line.
        clock (`Iterator[int]`, *optional*): where ``nuisance="clock"`` draws each rendered observation's value; give
            the environments of one run the same counter (e.g. ``functools.partial(CorridorEnv, nuisance="clock",
            clock=itertools.count(1))`` as the factory) so that no two of their observations are equal. Default: a
            counter of this environment's own, from 1.
        trap_door (`bool`, defaults to `False`): the dead end of room ``trap_room(task, length)`` ends the episode
            with reward 0.

    Raises:
        ValueError: ``length < 1``, ``max_turns < 1``, ``directions`` not 2 or 4, or ``nuisance`` not one of
            ``None``, ``"turn"``, ``"clock"``.

    Example::

        env = CorridorEnv()
        obs, info = env.reset(task=0, seed=0)
        for move in env.shortest_path_actions():
            obs, reward, done, info = env.step(move)
        assert info["won"] and reward == 1.0
    """

    name = "corridor"
    system_prompt = SYSTEM_PROMPT
    prompt_template = PROMPT_TEMPLATE
    invalid_action = "<invalid>"

    def __init__(self, length: int = 12, success_reward: float = 1.0, max_turns: int | None = None,
                 directions: int = 4, nuisance: str | None = None, anchor_drops_nuisance: bool = False,
                 trap_door: bool = False, clock: Iterator[int] | None = None):
        if nuisance is not None and nuisance not in NUISANCES:
            raise ValueError(f"nuisance must be None, 'turn' or 'clock', got {nuisance!r}")
        if directions not in (2, 4):
            raise ValueError(f"directions must be 2 (left/right) or 4 (up/down/left/right), got {directions!r}")
        if int(length) < 1:
            raise ValueError(f"length must be >= 1 (number of rooms), got {length}")
        if max_turns is not None and int(max_turns) < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.length = int(length)
        self.directions = int(directions)
        self.success_reward = float(success_reward)
        self.max_turns = int(max_turns) if max_turns is not None else 2 * self.length
        self.nuisance = nuisance
        self.anchor_drops_nuisance = bool(anchor_drops_nuisance)
        self.clock = clock if clock is not None else itertools.count(1)
        self.trap_door = bool(trap_door)
        self.task_type = (f"corridor{self.length}" + ("" if self.directions == 4 else "-lr")
                          + (f"-{nuisance}" if nuisance else "") + ("-trap" if self.trap_door else ""))
        self.trap_room = -1  # index of the room whose dead end is a trap door (-1: none)
        self.trapped = False
        self.rooms: tuple[Room, ...] = ()
        self.room = 0  # index of the current room; == length after the exit
        self.in_dead_end = False
        self.done = True
        self.won = False
        self.turn = 0
        self.task: Any = None

    # ------------------------------------------------------------------ protocol
    def reset(self, task: Any = None, seed: int | None = None) -> tuple[str, dict]:
        """Start corridor ``task`` (an int id; ``seed`` when ``task`` is None). The dynamics are deterministic,
        so ``seed`` does not change the episode."""
        task_id = task if task is not None else (seed if seed is not None else 0)
        self.task = int(task_id)
        self.rooms = generate_corridor(self.task, self.length, self.directions)
        self.trap_room = trap_room(self.task, self.length) if self.trap_door else -1
        self.trapped = False
        self.room = 0
        self.in_dead_end = False
        self.done = False
        self.won = False
        self.turn = 0
        return self.render(), self._info(instruction=INSTRUCTION)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        move = parse_move(action)
        if self.done:
            return self.render(), 0.0, True, self._info(action_valid=move is not None)
        self.turn += 1
        reward = 0.0
        if move is not None:
            room = self.rooms[self.room]
            if self.in_dead_end:
                if move == OPPOSITE[room.dead_end]:
                    self.in_dead_end = False
            elif move == room.dead_end and self.room == self.trap_room:
                self.done = self.trapped = True  # the trap door: the episode ends, no reward
            elif move == room.dead_end:
                self.in_dead_end = True
            elif move == room.passage:
                self.room += 1
                if self.room == self.length:
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
        """The observation: what lies in each direction of the current room or dead end, then the nuisance line
        if any (see module doc)."""
        if not self.rooms:
            return ""
        text = self._render_state()
        if self.nuisance == "turn":
            return f"{text}\nturn {self.turn}"
        if self.nuisance == "clock":
            return f"{text}\nclock {next(self.clock)}"
        return text

    def anchor_state(self, observation):
        """The observation, or (``anchor_drops_nuisance``) its first line: the state without the nuisance."""
        if self.anchor_drops_nuisance:
            return str(observation).split("\n", 1)[0]
        return observation

    def _render_state(self) -> str:
        if self.trapped:
            return f"trap door in room {self.room + 1}: you fell"
        if self.room >= self.length:
            return "outside: you found the exit"
        room = self.rooms[self.room]
        if self.in_dead_end:
            return f"{room.dead_end_kind} off room {self.room + 1}: {OPPOSITE[room.dead_end]} way out"
        kinds = {room.passage: room.passage_kind, room.dead_end: room.dead_end_kind}
        return f"room {self.room + 1}: " + ", ".join(f"{m} {kinds[m]}" for m in MOVES if m in kinds)

    def legal_moves(self) -> list[str]:
        """Moves that do not walk into a wall from the current state (both doors of a room; the way out of a
        dead end). Says nothing about which door leads on."""
        if not self.rooms or self.done:
            return list(MOVES)
        room = self.rooms[self.room]
        if self.in_dead_end:
            return [OPPOSITE[room.dead_end]]
        return [m for m in MOVES if m in (room.passage, room.dead_end)]

    def shortest_path_actions(self) -> list[str]:
        """The moves of a shortest way from the current state to the exit (empty once the episode is over)."""
        if not self.rooms or self.done:
            return []
        moves = [OPPOSITE[self.rooms[self.room].dead_end]] if self.in_dead_end else []
        return moves + [r.passage for r in self.rooms[self.room:]]

    def expert_action(self) -> str:
        """First move of a shortest way to the exit (``up`` once the episode is over)."""
        path = self.shortest_path_actions()
        return path[0] if path else "up"

    def _info(self, **extra: Any) -> dict:
        info = {
            "admissible_actions": list(MOVES) if self.directions == 4 else ["left", "right"],
            "won": self.won,
            "task_type": self.task_type,
            "task": self.task,
            "room": self.room,
            "in_dead_end": self.in_dead_end,
            "turn": self.turn,
        }
        if self.trap_door:
            info["trapped"] = self.trapped
        info.update(extra)
        return info
