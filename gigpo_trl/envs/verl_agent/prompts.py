"""verl-agent's prompt layout: one user message per turn, its history block and admissible list.

The structure of the paper's code (verl-agent ``env_manager.py`` ``build_text_obs``, ``memory/memory.py``
``SimpleMemory.fetch``, ``prompts/*.py``): ONE user message, no system message; the first step (or any step without
history) uses the env's ``first_prompt_template``, later steps its ``prompt_template``; the history block is one
line per shown step, ``[Observation n: '<obs>', Action n: '<action>']``, ``n`` numbered from the episode start,
joined by newlines, holding the *projected* action; an env's ``max_prompt_chars`` (WebShop: 13,000) falls back to
the first-step template when the prompt with history is longer. The wording is ours (each env's
``VERL_AGENT_*`` templates); pass ``prompt_template=`` / ``first_prompt_template=`` to the env to use any wording
verbatim, with the placeholders of :data:`VERL_AGENT_PLACEHOLDERS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


#: Placeholders of the verl-agent templates: ``{task}`` the task text, ``{observation}`` the current observation,
#: ``{admissible_actions}`` the admissible list in the env's style, ``{step_count}`` steps taken so far,
#: ``{history_length}`` the number of steps shown, ``{history}`` the history block, ``{current_step}`` =
#: step_count + 1. A template may use any subset.
VERL_AGENT_PLACEHOLDERS = ("task", "observation", "admissible_actions", "step_count", "history_length", "history",
                           "current_step")


def format_verl_agent_history(history: Sequence[tuple[str, str]], step_count: int) -> str:
    """verl-agent's history block: ``[Observation n: '<obs>', Action n: '<action>']`` per shown step, joined by
    ``"\n"``, where ``n`` counts from the episode start: the window of ``len(history)`` steps ends at step
    ``step_count`` (memory.py ``SimpleMemory.fetch``). ``""`` for an empty window.

    Raises:
        ValueError: the window holds more steps than ``step_count``.
    """
    if len(history) > step_count:
        raise ValueError(f"history window of {len(history)} steps cannot end at step {step_count}")
    first = step_count - len(history) + 1
    return "\n".join(f"[Observation {n}: '{obs}', Action {n}: '{act}']"
                      for n, (obs, act) in enumerate(history, start=first))


def format_admissible_verl_agent(actions: Sequence[str] | None, style: str) -> str:
    """The admissible list as verl-agent renders it between the template's brackets.

    ``style="alfworld"``: ``'a'\n 'b'`` without ``help`` (env_manager.py ``AlfWorldEnvironmentManager``);
    ``"webshop"``: ``'a',\n'b',`` (``WebshopEnvironmentManager``); ``"quoted"``: ``"a", "b"`` (Sokoban's fixed list).

    Raises:
        ValueError: unknown ``style``.
    """
    actions = list(actions or [])
    if style == "alfworld":
        return "\n ".join(f"'{a}'" for a in actions if a != "help")
    if style == "webshop":
        return "\n".join(f"'{a}'," for a in actions)
    if style == "quoted":
        return ", ".join(f'"{a}"' for a in actions)
    raise ValueError(f"admissible style {style!r} is not one of ['alfworld', 'webshop', 'quoted']")


def build_verl_agent_prompt(
    first_template: str,
    template: str,
    task: str,
    observation: Any,
    history: Sequence[tuple[str, str]],
    step_count: int,
    admissible_actions: Sequence[str] | None = None,
    admissible_style: str = "alfworld",
    max_prompt_chars: int | None = None,
) -> str:
    """The user message of one turn (see the module docstring).

    Args:
        first_template: used at the first step, and whenever ``history`` is empty.
        template: used at later steps.
        task: the episode's task text.
        observation: the current observation (rendered with ``str``).
        history: the shown (observation, projected action) pairs, oldest first, ending at step ``step_count``.
        step_count: steps taken so far in the episode (0 at the first step).
        admissible_actions / admissible_style: see :func:`format_admissible_verl_agent`.
        max_prompt_chars: when the prompt with history is longer than this many characters, the first-step
            template is used instead (verl-agent's WebShop rule, 13,000). ``None``: no limit.

    Raises:
        KeyError: a template uses a placeholder outside :data:`VERL_AGENT_PLACEHOLDERS` (the message names it).
    """
    values = {
        "task": task,
        "observation": str(observation),
        "admissible_actions": format_admissible_verl_agent(admissible_actions, admissible_style),
        "step_count": step_count,
        "history_length": len(history),
        "history": format_verl_agent_history(history, step_count),
        "current_step": step_count + 1,
    }

    def fill(text: str) -> str:
        try:
            return text.format(**values)
        except KeyError as exc:
            raise KeyError(f"prompt template placeholder {{{exc.args[0]}}} is not one of "
                           f"{list(VERL_AGENT_PLACEHOLDERS)}") from None

    if not history:
        return fill(first_template)
    prompt = fill(template)
    if max_prompt_chars is not None and len(prompt) > max_prompt_chars:
        return fill(first_template)
    return prompt


__all__ = ["VERL_AGENT_PLACEHOLDERS", "build_verl_agent_prompt", "format_admissible_verl_agent",
           "format_verl_agent_history"]
