"""The ALFWorld environment: prompts, the episode, the expert and the anchor state (see the package docstring)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from ..base import TextEnv
from .data import (
    OFFICIAL_SPLITS,
    OFFLINE_SPLITS,
    build_game_file,
    load_offline,
    official_games,
    resolve_official_root,
    user_alfworld_data,
)
from .engine import make_engine

SUCCESS_REWARD = 10.0
NOTHING_HAPPENS = "Nothing happens."
_BANNER_RE = re.compile(r"^\s*-= Welcome to TextWorld, ALFRED! =-\s*")
_TASK_RE = re.compile(r"Your task is to:\s*(.*\S)\s*$", re.S)

SYSTEM_PROMPT = (
    "You are a household robot in a text-based home. You reach the goal by walking to furniture and "
    "appliances, opening them, and taking, moving, heating, cooling, cleaning or using objects. "
    "Every turn you are given the list of admissible actions: choose exactly one of them, copied "
    "verbatim. First think briefly inside <think> </think>, then write the chosen action inside "
    "<action> </action>."
)
PROMPT_TEMPLATE = (
    "Your task is to: {instruction}\n"
    "{history}"
    "Turn {turn} of {max_turns}. What you observe now:\n{observation}\n"
    "{admissible_actions}"
    "Pick one admissible action. Answer as <think>your reasoning</think><action>the action</action>."
)


def _normalize(action: Any) -> str:
    return " ".join(str(action).strip().lower().split())


class ALFWorldEnv(TextEnv):
    """ALFWorld text environment (see the module docstring).

    Args:
        data_dir (`str`, *optional*): official ALFWorld data (the folder holding ``json_2.1.1``); defaults to
            ``$ALFWORLD_DATA`` when that variable is set, else the built-in offline games. A path that does
            not exist raises ``FileNotFoundError`` naming it. ``data_dir="builtin"`` forces the offline games.
        eval_split (`str`): official split that ``"eval"`` stands for: ``"valid_unseen"`` (default) or
            ``"valid_seen"``.
        cache_dir (`str`, *optional*): where offline games are rebuilt (default ``$GIGPO_CACHE/alfworld``).
        max_turns (`int`): steps after which the episode ends (default 50).
        prompt_template (`str`, *optional*): the user-message template, verbatim, with the placeholders of
            ``DEFAULT_PROMPT_TEMPLATE``. Default: this env's own wording.

    ``eval_split`` defaults to the class's ``default_eval_split`` (``"valid_unseen"``).
    """

    name = "alfworld"
    system_prompt = SYSTEM_PROMPT
    prompt_template = PROMPT_TEMPLATE
    invalid_action = "<invalid action>"
    max_turns = 50

    default_eval_split = "valid_unseen"

    def __init__(self, data_dir: str | None = None, eval_split: str | None = None,
                 cache_dir: str | None = None, max_turns: int = 50, prompt_template: str | None = None):
        if prompt_template is not None:
            self.prompt_template = prompt_template
        if eval_split is None:
            eval_split = self.default_eval_split
        if eval_split not in ("valid_seen", "valid_unseen"):
            raise ValueError(f"eval_split must be 'valid_seen' or 'valid_unseen', got {eval_split!r}")
        if data_dir is None:
            data_dir = user_alfworld_data()
        self.offline = data_dir is None or data_dir == "builtin"
        self.root = None if self.offline else resolve_official_root(data_dir)
        self.eval_split = eval_split
        self.cache_dir = cache_dir
        self.max_turns = int(max_turns)
        self._engine = None
        self._loaded_path: str | None = None
        self._game_paths: dict[str, str] = {}
        self._state = None
        self._task: str | None = None
        self._task_type: str | None = None
        self._instruction = ""
        self._informative: str | None = None  # last observation other than "Nothing happens."
        self._admissible: list[str] = []
        self._turn = 0
        self._done = True
        self._walk: list[str] | None = None  # expert_action's walkthrough, read on first use
        self._walk_pos = 0

    # -- tasks -------------------------------------------------------------------------------------------
    def _resolve_split(self, split: str) -> str:
        if self.offline:
            alias = {"valid_unseen": "eval"}.get(split, split)
            if alias not in OFFLINE_SPLITS:
                raise ValueError(
                    f"unknown ALFWorld split {split!r}; the built-in games have {list(OFFLINE_SPLITS)}"
                )
            return alias
        alias = self.eval_split if split == "eval" else split
        if alias not in OFFICIAL_SPLITS:
            choices = list(OFFICIAL_SPLITS) + ["eval"]
            raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {choices}")
        return alias

    def _split_rows(self, split: str) -> list[tuple[str, str]]:
        split = self._resolve_split(split)
        if self.offline:
            return [(g["id"], g["task_type"]) for g in load_offline()["games"] if g["split"] == split]
        return official_games(self.root, split)

    def tasks(self, split: str = "train"):
        """``datasets.Dataset`` with columns ``task`` (game id), ``seed`` (row index; games are deterministic)
        and ``task_type``. Raises ``ValueError`` for an unknown split."""
        from datasets import Dataset

        rows = self._split_rows(split)
        return Dataset.from_dict({
            "task": [t for t, _ in rows],
            "seed": list(range(len(rows))),
            "task_type": [tt for _, tt in rows],
        })

    def task_type_of(self, task: str) -> str:
        if self.offline:
            return self._record(task)["task_type"]
        with open(os.path.join(os.path.dirname(self._game_path(task)), "traj_data.json")) as f:
            return json.load(f)["task_type"]

    def _record(self, task: str) -> dict:
        rec = load_offline()["by_id"].get(str(task))
        if rec is None:
            raise KeyError(f"unknown ALFWorld task {task!r} (not among the built-in games)")
        return rec

    def _game_path(self, task: str) -> str:
        task = str(task)
        if task in self._game_paths:
            return self._game_paths[task]
        if self.offline:
            path = build_game_file(self._record(task), self.cache_dir)
        else:
            path = task if os.path.isabs(task) else os.path.join(self.root, task)
            if os.path.isdir(path):
                path = os.path.join(path, "game.tw-pddl")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"ALFWorld game file not found: {path!r} (task {task!r})")
        self._game_paths[task] = path
        return path

    def expert_walkthrough(self, task: str) -> list[str]:
        """A command list that solves ``task`` (computed offline and committed; for official data, the
        ``walkthrough`` stored in its ``game.tw-pddl``)."""
        if self.offline:
            return list(self._record(task)["walkthrough"])
        with open(self._game_path(task)) as f:
            walk = json.load(f).get("walkthrough")
        if not walk:
            raise ValueError(f"ALFWorld game {task!r} has no stored walkthrough")
        return list(walk)

    # -- episode -----------------------------------------------------------------------------------------
    def reset(self, task: Any = None, seed: int | None = None) -> tuple[str, dict]:
        if task is None:
            task = self._split_rows("train")[0][0]
        task = str(task)
        path = self._game_path(task)
        if self._engine is None:
            self._engine = make_engine()
        if self._loaded_path != path:
            self._engine.load(path)
            self._loaded_path = path
        state = self._engine.reset()
        self._state = state
        self._task = task
        self._task_type = self.task_type_of(task)
        text, self._instruction = self._first_observation(task, str(state["feedback"]))
        self._admissible = [c for c in state["admissible_commands"] if c != "help"]
        self._turn = 0
        self._done = False
        self._walk, self._walk_pos = None, 0  # expert_action's walkthrough, read on first use
        self._informative = text
        info = {
            "instruction": self._instruction,
            "admissible_actions": list(self._admissible),
            "task_type": self._task_type,
            "won": bool(state["won"]),
            "task": task,
        }
        return text, info

    def _first_observation(self, task: str, feedback: str) -> tuple[str, str]:
        """``(observation, instruction)`` of the reset feedback: the text without the TextWorld banner, and the task
        line's text."""
        text = _BANNER_RE.sub("", feedback).strip()
        m = _TASK_RE.search(text)
        return text, m.group(1) if m else ""

    def _check_step(self) -> None:
        if self._state is None:
            raise RuntimeError(f"{type(self).__name__}.step called before reset")
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step called after the episode ended; call reset")

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self._check_step()
        command = _normalize(action)
        valid = command in self._admissible
        if valid:
            state, _, _ = self._engine.step(command)
            self._state = state
            self._advance_walk(command)
            obs = str(state["feedback"]).strip()
            self._admissible = [c for c in state["admissible_commands"] if c != "help"]
        else:
            obs = NOTHING_HAPPENS  # what the engine answers too; the state is unchanged
        if obs != NOTHING_HAPPENS:
            self._informative = obs
        won = bool(self._state["won"])
        self._turn += 1
        done = won or self._turn >= self.max_turns
        self._done = done
        info = {
            "admissible_actions": list(self._admissible),
            "action_valid": valid,
            "won": won,
            "task_type": self._task_type,
            "turn": self._turn,
        }
        return obs, (SUCCESS_REWARD if won else 0.0), done, info

    def expert_action(self) -> str:
        """The expert (the warm-up's demonstrator): the next command of the game's walkthrough
        (:meth:`expert_walkthrough`), replayed from the reset; an executed command equal to the walkthrough's next
        one advances it. After an action off the walkthrough its rest is still proposed, and may no longer apply
        (no planner re-plans here; the warm-up drops the demonstrations the game rejects). ``"look"`` once the
        walkthrough is used up or the episode is over."""
        if self._task is None or self._done:
            return "look"
        if self._walk is None:
            self._walk, self._walk_pos = self.expert_walkthrough(self._task), 0
        return self._walk[self._walk_pos] if self._walk_pos < len(self._walk) else "look"

    def _advance_walk(self, command: str) -> None:
        walk, pos = self._walk, self._walk_pos
        if walk is not None and pos < len(walk) and _normalize(walk[pos]) == _normalize(command):
            self._walk_pos = pos + 1

    def anchor_state(self, observation: Any) -> Any:
        """The observation, except after ``"Nothing happens."`` (an invalid or ineffective action, in any room
        with any inventory): the state did not change, so the anchor is the last informative observation (the
        reset text or the last other feedback), and such rows share a step group with the rows acting from that
        state rather than with every other failed action of the group (GiGPO Sec. 3.2)."""
        if observation == NOTHING_HAPPENS and self._informative is not None:
            return self._informative
        return observation

    def close(self) -> None:
        if self._engine is not None:
            try:
                self._engine.close()
            except Exception:
                pass
        self._engine = None
        self._loaded_path = None
        self._state = None
