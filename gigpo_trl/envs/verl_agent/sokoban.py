"""Sokoban as the text mode of the GiGPO paper's code runs it (``protocol="verl-agent"``): :class:`PaperSokobanEnv`.

verl-agent ``env_package/sokoban``, ``env_manager.py`` ``SokobanEnvironmentManager``, gym-sokoban's rewards: the
observation is rendered as verl-agent's ``tiny_rgb_array`` text (each cell ``" <symbol> \t"``, rows joined by
newlines); actions are the ids of :func:`gigpo_trl.envs.verl_agent.projection.project` (1 up, 2 down, 3 left,
4 right, 0 "still": no move, reward -0.1, not counted as a step); the reward is gym-sokoban's: -0.1 per step, +1 for
a box pushed onto a target, -1 for one pushed off, +10 when all boxes are on targets; ``info`` has no
``action_valid`` (validity is the projection's bit); the prompt is one user message with the admissible list
``"up", "down", "left", "right"``. The levels stay ours (:func:`gigpo_trl.envs.sokoban.generate_level`; the paper
generates them with gym-sokoban's ``generate_room``; its Sokoban runs use the image observation and a
vision-language model): a deviation by design.
"""

from __future__ import annotations

from typing import Any

from ..sokoban import ACTION_NAMES, Level, SokobanEnv, apply_move, is_solved, render_level
from .base import PaperProtocol

# Our wording of verl-agent's two text-mode Sokoban templates (same structure as its prompts/sokoban.py; placeholders
# in gigpo_trl.envs.verl_agent.prompts.VERL_AGENT_PLACEHOLDERS).
_VERL_AGENT_RULES = (
    "You are an expert Sokoban player.\n\n"
    "# Symbols\n"
    "- Wall (`#`): nothing moves through it.\n"
    "- Floor (`_`): free space for you and the boxes.\n"
    "- Target (`O`): where a box must end up.\n"
    "- Box (`X`): push these onto the targets.\n"
    "- Player (`P`): you.\n"
    "- Box on target (`√`): a box already in place.\n"
    "- Player on target (`S`): you, standing on a target.\n\n"
    "# Goal\n"
    "Push every box (`X`) onto a target (`O`); you win when all of them are in place.\n\n"
    "# Rules\n"
    "Boxes can be pushed but never pulled, so think ahead. Neither you nor a box can enter a wall (`#`). "
    "A box pushed into a corner or along a wall may never move again.\n\n"
    "# This step\n"
)
_VERL_AGENT_ASK = (
    "The moves you may make are [{admissible_actions}].\n\n"
    "Make ONE move for this step. First reason step by step inside <think> </think>: where are the boxes and the "
    "targets, which path pushes a box towards a target, which traps to avoid. Then write one of the moves inside "
    "<action> </action>.\n"
)
VERL_AGENT_FIRST_TEMPLATE = _VERL_AGENT_RULES + "What you observe now:\n{observation}\n" + _VERL_AGENT_ASK
VERL_AGENT_TEMPLATE = (
    _VERL_AGENT_RULES
    + "You have taken {step_count} step(s) so far. Your last {history_length} observation(s), each with the action "
    "you took after it: {history}\n"
    "This is step {current_step}. What you observe now:\n{observation}\n" + _VERL_AGENT_ASK
)
#: gym-sokoban's rewards (verl-agent's Sokoban env subclasses gym-sokoban's SokobanEnv).
PAPER_STEP_REWARD, PAPER_BOX_ON_TARGET, PAPER_BOX_OFF_TARGET, PAPER_FINISHED = -0.1, 1.0, -1.0, 10.0
#: verl-agent's action ids (its sokoban projection); 0 is "still", a no-op.
PAPER_ACTION_MOVES = {1: "up", 2: "down", 3: "left", 4: "right"}


def render_level_verl_agent(level: Level) -> str:
    """``level`` as verl-agent's text Sokoban shows it (``tiny_rgb_array``): every cell ``" <symbol> \\t"``, the
    cells of a row concatenated, rows joined by ``"\\n"``."""
    return "\n".join("".join(f" {ch} \t" for ch in row.split(" ")) for row in render_level(level).split("\n"))


def paper_eval_seeds(seed: int = 0, num_episodes: int = 128, eval_round: int = 0) -> list[int]:
    """Level seeds of verl-agent's Sokoban validation: its validation envs call ``np.random.seed(seed + 1000)`` and
    each validation reset draws ``np.random.randint(2**16, 2**32 - 1, size=num_episodes)``
    (``env_package/sokoban/envs.py``). Round 0 (the validation before training) is the paper's draw exactly; in the
    paper later rounds share numpy's global generator with the training resets, so round ``r`` > 0 here is the
    generator's ``r``-th next draw without those, not the paper's.

    Raises:
        ValueError: ``num_episodes`` < 1 or ``eval_round`` < 0.
    """
    import numpy as np

    if num_episodes < 1 or eval_round < 0:
        raise ValueError(f"need num_episodes >= 1 and eval_round >= 0, got {num_episodes} and {eval_round}")
    rng = np.random.RandomState(int(seed) + 1000)
    for _ in range(eval_round):
        rng.randint(2**16, 2**32 - 1, size=num_episodes)
    return [int(x) for x in rng.randint(2**16, 2**32 - 1, size=num_episodes)]


class PaperSokobanEnv(PaperProtocol, SokobanEnv):
    """Sokoban under the paper's protocol (see the module docstring).

    Args:
        dim_room, num_boxes, max_turns: as :class:`~gigpo_trl.envs.sokoban.SokobanEnv` (gym-sokoban's rewards
            replace ``success_reward`` / ``step_penalty``).
        prompt_template (`str`, *optional*): the later-step template, verbatim (placeholders in
            :data:`~gigpo_trl.envs.verl_agent.prompts.VERL_AGENT_PLACEHOLDERS`).
        first_prompt_template (`str`, *optional*): the first-step template.
    """

    default_template = VERL_AGENT_TEMPLATE
    default_first_template = VERL_AGENT_FIRST_TEMPLATE
    admissible_style = "quoted"

    def __init__(self, dim_room: tuple[int, int] = (6, 6), num_boxes: int = 1, max_turns: int = 15,
                 prompt_template: str | None = None, first_prompt_template: str | None = None):
        super().__init__(dim_room=dim_room, num_boxes=num_boxes, max_turns=max_turns)
        self.init_templates(prompt_template, first_prompt_template)

    def step(self, action: Any) -> tuple[str, float, bool, dict]:
        """An action id (0 still, 1-4 up/down/left/right; a move word is accepted too) and gym-sokoban's rewards.

        Raises:
            RuntimeError: called before ``reset``.
            ValueError: anything but an action id or a move word.
        """
        if self.level is None:
            raise RuntimeError(f"{type(self).__name__}.step called before reset")
        if isinstance(action, str) and action.strip().lower() in ACTION_NAMES:
            action = ACTION_NAMES.index(action.strip().lower()) + 1
        if isinstance(action, bool) or action not in (0, *PAPER_ACTION_MOVES):
            raise ValueError(f"SokobanEnv(protocol='verl-agent') takes an action id 0-4, got {action!r}")
        if self.done:
            return self.render(), 0.0, True, self._info()
        if action == 0:  # "still": verl-agent returns before gym-sokoban counts a step
            return self.render(), PAPER_STEP_REWARD, False, self._info()
        self.turn += 1
        before = self.level
        self.level = apply_move(before, PAPER_ACTION_MOVES[int(action)])
        on_before = len(before.boxes & before.targets)
        on_after = len(self.level.boxes & self.level.targets)
        reward = PAPER_STEP_REWARD
        reward += PAPER_BOX_ON_TARGET * max(0, on_after - on_before)
        reward += PAPER_BOX_OFF_TARGET * max(0, on_before - on_after)
        if is_solved(self.level):
            self.done = self.won = True
            reward += PAPER_FINISHED
        truncated = not self.done and self.turn >= self.max_turns
        self.done = self.done or truncated
        return self.render(), reward, self.done, self._info(truncated=truncated)

    def paper_eval_tasks(self, num_episodes: int = 128, seed: int = 0, eval_round: int = 0):
        """The paper's validation episodes as a task dataset whose level ids are :func:`paper_eval_seeds` (our
        generator builds the level from each id; sample at temperature 0.4 to match the paper)."""
        import datasets

        ids = paper_eval_seeds(seed, num_episodes, eval_round)
        return datasets.Dataset.from_dict({"task": ids, "seed": ids, "task_type": [self.task_type] * len(ids)})

    def render(self) -> str:
        return render_level_verl_agent(self.level) if self.level is not None else ""


__all__ = ["PAPER_ACTION_MOVES", "PaperSokobanEnv", "VERL_AGENT_FIRST_TEMPLATE", "VERL_AGENT_TEMPLATE",
           "paper_eval_seeds", "render_level_verl_agent"]
