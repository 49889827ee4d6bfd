""":class:`PaperProtocol`: what makes an environment run the paper's protocol, as the two hooks the collector calls.

An environment class of this package is ``class PaperX(PaperProtocol, X)``: the project's environment ``X`` with the
paper's projection (``parse_completion``), prompt layout (``build_messages``) and templates; each class then
overrides what the paper's environment code does differently (observations, rewards, anchors, evaluation draw).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..base import ParsedAction
from .projection import project
from .prompts import build_verl_agent_prompt


class PaperProtocol:
    """Mixin (first base) of the paper's environment classes.

    Class attributes a subclass sets:
        protocol (`str`): ``"verl-agent"``: the label a published number names (never tested by the collector).
        default_template / default_first_template (`str`): our wording of the paper's later-step and first-step
            templates (placeholders: :data:`~gigpo_trl.envs.verl_agent.prompts.VERL_AGENT_PLACEHOLDERS`).
        admissible_style (`str`): how the admissible list is rendered
            (:func:`~gigpo_trl.envs.verl_agent.prompts.format_admissible_verl_agent`).
        max_prompt_chars (`int` or `None`): see :func:`~gigpo_trl.envs.verl_agent.prompts.build_verl_agent_prompt`.
        eval_draw (`str`): how ``paper_eval_tasks`` draws its episodes, in words (the job prints it).

    The env's ``name`` picks the projection (:func:`~gigpo_trl.envs.verl_agent.projection.project`).
    """

    protocol = "verl-agent"
    default_template: str = ""
    default_first_template: str = ""
    admissible_style = "alfworld"
    max_prompt_chars: int | None = None
    eval_draw = "drawn as verl-agent's eval workers do"
    #: Keywords this protocol adds to the project's environment, with what they are (``make_env``'s errors).
    protocol_options = {"first_prompt_template": "its first-step template"}

    def init_templates(self, prompt_template: str | None, first_prompt_template: str | None) -> None:
        """Set ``prompt_template`` / ``first_prompt_template``: the given ones (verbatim), else our wording."""
        self.prompt_template = prompt_template or self.default_template
        self.first_prompt_template = first_prompt_template or self.default_first_template

    def parse_completion(self, text: str) -> ParsedAction:
        """The paper's projection of ``text`` for this env (any completion; ``TypeError`` for a non-``str``)."""
        return project(text, self.name)

    def build_messages(self, instruction: str, observation: Any, history: Sequence[tuple[str, str]], turn: int,
                       max_turns: int, admissible_actions: Sequence[str] | None = None) -> list[dict[str, str]]:
        """One user message (:func:`~gigpo_trl.envs.verl_agent.prompts.build_verl_agent_prompt`): ``turn`` is the
        step count and ``instruction`` the task; ``max_turns`` is not shown.

        Raises:
            KeyError: a template uses a placeholder outside ``VERL_AGENT_PLACEHOLDERS``.
        """
        content = build_verl_agent_prompt(self.first_prompt_template, self.prompt_template, instruction, observation,
                                          history, turn, admissible_actions, self.admissible_style,
                                          self.max_prompt_chars)
        return [{"role": "user", "content": content}]


__all__ = ["PaperProtocol"]
