"""ALFWorld as the GiGPO paper's code runs it (``protocol="verl-agent"``): :class:`PaperALFWorldEnv`.

verl-agent ``env_manager.py`` ``AlfWorldEnvironmentManager`` and ``env_package/alfworld/envs.py``: the observation is
the engine's raw text (the reset text keeps its ``-= Welcome to TextWorld, ALFRED! =-`` banner), every projected
action goes to the engine as is (it answers ``"Nothing happens."`` itself), ``info`` carries no ``action_valid``
(validity is the projection's bit only, :func:`gigpo_trl.envs.verl_agent.projection.project`), the anchor is the raw
observation, the task is the text after ``"Your task is to: "``, prompts follow
:func:`gigpo_trl.envs.verl_agent.prompts.build_verl_agent_prompt` with the admissible list rendered ``'a'\n 'b'``
without ``help``, and ``"eval"`` stands for ``valid_seen`` (the paper's ``eval_in_distribution``). Its evaluation
draw is :func:`paper_eval_draw` (:meth:`PaperALFWorldEnv.paper_eval_tasks`).
"""

from __future__ import annotations

from typing import Any

from ..alfworld import SUCCESS_REWARD, ALFWorldEnv
from .base import PaperProtocol

# Our wording of the paper's two ALFWorld templates (same structure as verl-agent's prompts/alfworld.py; placeholders
# in gigpo_trl.envs.verl_agent.prompts.VERL_AGENT_PLACEHOLDERS).
VERL_AGENT_FIRST_TEMPLATE = (
    "You are an expert household agent in the ALFRED text world.\n"
    "What you observe now: {observation}\n"
    "The actions you may take now: [{admissible_actions}].\n\n"
    "Pick your action for this step. First reason about the situation step by step inside <think> </think>. "
    "Then write one of the admissible actions for this step inside <action> </action>.\n"
)
VERL_AGENT_TEMPLATE = (
    "You are an expert household agent in the ALFRED text world. Your task is to: {task}\n"
    "You have taken {step_count} step(s) so far. Your last {history_length} observation(s), each with the action "
    "you took after it: {history}\n"
    "This is step {current_step}. What you observe now: {observation}\n"
    "The actions you may take now: [{admissible_actions}].\n\n"
    "Pick your action for this step. First reason about the situation step by step inside <think> </think>. "
    "Then write one of the admissible actions for this step inside <action> </action>.\n"
)
#: verl-agent's validation envs are seeded ``env.seed + 1000`` (env_manager.py ``make_envs``).
PAPER_VAL_SEED_OFFSET = 1000
_TASK_PREFIX = "Your task is to: "


def textworld_game_draw(games: list[str], worker_seed: int, count: int) -> list[str]:
    """The first ``count`` games one verl-agent ALFWorld worker plays, in order.

    Each worker holds TextWorld's gym env seeded with ``worker_seed`` (``env.seed(seed)``,
    textworld/gym/envs/textworld_batch.py ``seed``): ``RandomState(worker_seed)`` shuffles a copy of ``games``,
    the worker plays that order, then reshuffles the list in place with the same generator for every further pass
    (textworld/gym/envs/utils.py ``shuffled_cycle``). Repeats across workers are possible; within a pass, none.

    Raises:
        ValueError: ``games`` is empty or ``count`` < 0.
    """
    import numpy as np

    if not games:
        raise ValueError("textworld_game_draw needs a non-empty game list")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    rng = np.random.RandomState(int(worker_seed))
    order = list(games)
    rng.shuffle(order)
    out = []
    while len(out) < count:
        out.extend(order[: count - len(out)])
        if len(out) < count:
            rng.shuffle(order)
    return out


def paper_eval_draw(games: list[str], seed: int = 0, num_episodes: int = 128, group_n: int = 1,
                    eval_round: int = 0) -> list[str]:
    """The games of verl-agent's ALFWorld validation ``eval_round`` (0 = the validation before training), one per
    episode, in worker order.

    verl-agent (``env_package/alfworld/envs.py``): ``num_episodes`` workers (``val_data_size``, 128), worker ``i``
    seeded ``seed + PAPER_VAL_SEED_OFFSET + i // group_n`` (``group_n`` = 1 for validation), each reset drawing the
    worker's next game (:func:`textworld_game_draw`); round ``r`` plays each worker's game ``r`` (0-based). With
    ``trainer.test_freq`` 5 and ``val_before_train`` the validation after ``s`` iterations is round ``s // 5``.

    ``games`` must be in the paper's list order for the same draw; verl-agent takes ``os.walk`` order of the split
    folder, which depends on the file system, so :class:`ALFWorldEnv` passes its sorted list (a documented
    deviation).

    Raises:
        ValueError: empty ``games``, ``num_episodes`` or ``group_n`` < 1, or ``eval_round`` < 0.
    """
    if num_episodes < 1 or group_n < 1 or eval_round < 0:
        raise ValueError(f"need num_episodes >= 1, group_n >= 1, eval_round >= 0; got num_episodes={num_episodes}, "
                         f"group_n={group_n}, eval_round={eval_round}")
    base = int(seed) + PAPER_VAL_SEED_OFFSET
    return [textworld_game_draw(games, base + i // group_n, eval_round + 1)[eval_round] for i in range(num_episodes)]


class PaperALFWorldEnv(PaperProtocol, ALFWorldEnv):
    """ALFWorld under the paper's protocol (see the module docstring).

    Args:
        data_dir, eval_split, cache_dir, max_turns: as :class:`~gigpo_trl.envs.alfworld.ALFWorldEnv`;
            ``eval_split`` defaults to ``"valid_seen"``.
        prompt_template (`str`, *optional*): the later-step template, verbatim, with the placeholders of
            :data:`~gigpo_trl.envs.verl_agent.prompts.VERL_AGENT_PLACEHOLDERS`. Default: ``VERL_AGENT_TEMPLATE``.
        first_prompt_template (`str`, *optional*): the first-step template (no history). Default:
            ``VERL_AGENT_FIRST_TEMPLATE``.
    """

    default_template = VERL_AGENT_TEMPLATE
    default_first_template = VERL_AGENT_FIRST_TEMPLATE
    admissible_style = "alfworld"
    default_eval_split = "valid_seen"

    def __init__(self, data_dir: str | None = None, eval_split: str | None = None, cache_dir: str | None = None,
                 max_turns: int = 50, prompt_template: str | None = None, first_prompt_template: str | None = None):
        super().__init__(data_dir=data_dir, eval_split=eval_split, cache_dir=cache_dir, max_turns=max_turns)
        self.init_templates(prompt_template, first_prompt_template)

    def paper_eval_split(self) -> str:
        """The split the paper evaluates on: ``valid_seen`` with official data; the built-in offline games have no
        valid_seen (their eval games are unseen scenes), so ``"eval"`` stands in for it."""
        return "eval" if self.offline else "valid_seen"

    def paper_eval_tasks(self, num_episodes: int = 128, seed: int = 0, eval_round: int = 0,
                         split: str | None = None):
        """The paper's evaluation episodes as a task dataset (columns ``task``, ``seed`` = worker index,
        ``task_type``): :func:`paper_eval_draw` over the sorted games of ``split`` (default
        :meth:`paper_eval_split`). Sample them at temperature 0.4 to match the paper."""
        from datasets import Dataset

        rows = self._split_rows(split or self.paper_eval_split())
        types = dict(rows)
        drawn = paper_eval_draw([t for t, _ in rows], seed=seed, num_episodes=num_episodes, eval_round=eval_round)
        return Dataset.from_dict({"task": drawn, "seed": list(range(len(drawn))),
                                  "task_type": [types[t] for t in drawn]})

    def _first_observation(self, task: str, feedback: str) -> tuple[str, str]:
        """The raw text; the task is what follows "Your task is to: " (env_manager.py ``extract_task``).

        Raises:
            ValueError: the reset text has no task line (the message names the game).
        """
        start = feedback.find(_TASK_PREFIX)
        if start == -1:
            raise ValueError(f"ALFWorld game {task!r}: no {_TASK_PREFIX!r} in the first observation")
        return feedback, feedback[start + len(_TASK_PREFIX):].strip()

    def step(self, action: Any) -> tuple[str, float, bool, dict]:
        """The projected action goes to the engine verbatim; the raw feedback comes back. ``info`` has
        ``action_admissible`` (whether the action was in the admissible list) and no ``action_valid``."""
        self._check_step()
        command = str(action)
        admissible = command in self._admissible
        state, _, _ = self._engine.step(command)
        self._advance_walk(command)
        self._state = state
        obs = str(state["feedback"])
        self._admissible = [c for c in state["admissible_commands"] if c != "help"]
        won = bool(state["won"])
        self._turn += 1
        self._done = won or self._turn >= self.max_turns
        info = {"admissible_actions": list(self._admissible), "action_admissible": admissible, "won": won,
                "task_type": self._task_type, "turn": self._turn}
        return obs, (SUCCESS_REWARD if won else 0.0), self._done, info

    def anchor_state(self, observation: Any) -> Any:
        """The raw observation itself (env_manager.py ``'anchor': text_obs``)."""
        return observation


__all__ = ["PAPER_VAL_SEED_OFFSET", "PaperALFWorldEnv", "VERL_AGENT_FIRST_TEMPLATE", "VERL_AGENT_TEMPLATE",
           "paper_eval_draw", "textworld_game_draw"]
