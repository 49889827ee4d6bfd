"""Build the chat prompt of one environment turn: instruction, history window, observation, actions.

GiGPO (Sec. 4, prompts in App.) conditions the policy on the current observation plus the last ``k``
observation/action pairs rather than the whole episode, so prompt length stays bounded at 50 turns.

Two layouts, chosen by the env's ``protocol`` attribute (``gigpo_trl.envs.base.PROTOCOLS``):

- ``"gigpo-trl"`` (default): a system message (``env.system_prompt``) and a user message from
  ``env.prompt_template`` (placeholders ``{instruction} {history} {observation} {admissible_actions} {turn}
  {max_turns}``); history steps numbered within the window.
- ``"verl-agent"``: the structure of the paper's code (verl-agent ``env_manager.py`` ``build_text_obs``,
  ``memory/memory.py`` ``SimpleMemory.fetch``, ``prompts/*.py``): ONE user message, no system message; the first
  step (or any step without history) uses ``env.first_prompt_template``, later steps ``env.prompt_template``; the
  history block is one line per shown step, ``[Observation n: '<obs>', Action n: '<action>']``, ``n`` numbered
  from the episode start, joined by newlines, holding the *projected* action; ``env.max_prompt_chars`` (WebShop:
  13,000) falls back to the first-step template when the prompt with history is longer. The wording is ours
  (each env's ``VERL_AGENT_*`` templates); pass ``prompt_template=`` / ``first_prompt_template=`` to the env to use
  any wording verbatim, with the placeholders of :data:`VERL_AGENT_PLACEHOLDERS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .envs.base import DEFAULT_PROMPT_TEMPLATE, DEFAULT_SYSTEM_PROMPT


def format_history(history: Sequence[tuple[str, str]]) -> str:
    """Render ``history`` (oldest first). Steps are numbered within the window, not by absolute turn, so a
    prompt at turn 49 is no longer than one at turn 4 when observations have the same size."""
    if not history:
        return ""
    lines = [f"Your last {len(history)} step(s), oldest first:"]
    for i, (observation, action) in enumerate(history, start=1):
        lines.append(f"[Step {i} observation]\n{observation}\n[Step {i} action] {action}")
    return "\n".join(lines) + "\n"


def format_admissible(actions: Sequence[str] | None) -> str:
    """Render the admissible actions, or nothing when the env does not list them."""
    if not actions:
        return ""
    return "Admissible actions: " + ", ".join(f"'{a}'" for a in actions) + "\n"


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
    """The user message of one turn under ``protocol="verl-agent"`` (see the module docstring).

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


def build_messages(
    env: Any,
    instruction: str,
    observation: Any,
    history: Sequence[tuple[str, str]],
    turn: int,
    max_turns: int,
    admissible_actions: Sequence[str] | None = None,
) -> list[dict[str, str]]:
    """Chat messages (system + user) for one turn.

    Args:
        env: the environment (for its ``system_prompt`` and ``prompt_template``; defaults when missing).
        instruction: the task text of the episode.
        observation: the current observation (rendered with ``str``).
        history: the (observation, action) pairs to show, oldest first; the caller picks the window.
        turn: 0-based index of the current turn.
        max_turns: the episode's turn limit.
        admissible_actions: actions to list, if the env provides them.

    Under ``env.protocol == "verl-agent"`` the result is one user message (:func:`build_verl_agent_prompt`, with
    ``turn`` as the step count and ``instruction`` as the task); otherwise system + user.

    Raises:
        KeyError: the env's ``prompt_template`` uses a placeholder other than the documented ones.
    """
    if getattr(env, "protocol", "gigpo-trl") == "verl-agent":
        content = build_verl_agent_prompt(
            env.first_prompt_template, env.prompt_template, instruction, observation, history, turn,
            admissible_actions, getattr(env, "admissible_style", "alfworld"), getattr(env, "max_prompt_chars", None),
        )
        return [{"role": "user", "content": content}]
    template = getattr(env, "prompt_template", None) or DEFAULT_PROMPT_TEMPLATE
    system = getattr(env, "system_prompt", None) or DEFAULT_SYSTEM_PROMPT
    user = template.format(
        instruction=instruction,
        history=format_history(history),
        observation=str(observation),
        admissible_actions=format_admissible(admissible_actions),
        turn=turn,
        max_turns=max_turns,
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
