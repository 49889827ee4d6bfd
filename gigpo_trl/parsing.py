"""Parse a model completion into an environment action.

Two protocols (``gigpo_trl.envs.base.PROTOCOLS``):

- ``"gigpo-trl"`` (default, this project's rule): the format is ``<think>reasoning</think><action>the action</action>``
  (GiGPO paper, App. prompts); any other shape is *invalid*: exactly one non-empty ``<action>`` block after a
  ``<think>`` block is valid. The environment still receives a fallback string so the episode goes on.
- ``"verl-agent"`` (the paper's code): the projection functions of verl-agent,
  ``agent_system/environments/env_package/{alfworld,webshop,sokoban}/projection.py``, reproduced rule for rule
  (our own code): lower-case the whole completion; the action is the text between the first ``<action>`` and the
  first ``</action>`` of the lower-cased text, stripped (empty when ``</action>`` comes first); without either tag
  the env gets the last 30 (ALFWorld) / 20 (WebShop) characters of the lower-cased text and the turn is invalid;
  the turn is also invalid when ``<think>`` or ``</think>`` is missing from the *original* text (case-sensitive)
  or, for ALFWorld and WebShop, when it contains a CJK ideograph (U+4E00-U+9FFF). Several blocks, an empty block
  or a non-admissible action stay valid. Sokoban maps the extracted text to an action id by substring over
  ``up, down, left, right, still`` (first match in that order; ``still`` is id 0, a no-op that counts as valid);
  no tags or no match gives id 0, invalid; Sokoban has no CJK check.

:func:`parse_action` returns a :class:`ParsedAction`, which also unpacks and compares as the projection's
``(action, valid)`` pair.
"""

from __future__ import annotations

import re
from typing import Any

from .envs.base import ParsedAction, check_protocol

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)
_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_ACTION_OPEN = re.compile(r"<action>", re.IGNORECASE)
_CJK = re.compile("[\u4e00-\u9fff]")

#: Characters of the lower-cased completion sent to the env when a verl-agent completion has no action tags.
VERL_AGENT_TAIL_CHARS = {"alfworld": 30, "webshop": 20}
#: verl-agent's Sokoban action pool, in its lookup order (substring match, first hit wins).
SOKOBAN_ACTION_IDS = {"up": 1, "down": 2, "left": 3, "right": 4, "still": 0}
#: How verl-agent's Sokoban memory writes an action id into the prompt's history (env_manager.py ACTION_LOOKUP).
SOKOBAN_ACTION_NAMES = {0: "Still", 1: "Up", 2: "Down", 3: "Left", 4: "Right"}
VERL_AGENT_ENVS = ("alfworld", "webshop", "sokoban")


def parse_action(text: str, fallback: str = "<invalid>", require_think: bool = True, *,
                 protocol: str = "gigpo-trl", env: str | None = None) -> ParsedAction:
    """Extract the action of one completion.

    Args:
        text: the decoded completion (any content: empty, non-ASCII, cut at the length limit).
        fallback: ``"gigpo-trl"`` only: the string sent to the environment when no action can be extracted.
        require_think: ``"gigpo-trl"`` only: mark completions without a ``<think>…</think>`` block invalid (the
            action, if present, is still sent to the environment). verl-agent always checks both think tags.
        protocol: ``"gigpo-trl"`` or ``"verl-agent"`` (see the module docstring).
        env: with ``"verl-agent"``, whose projection: ``"alfworld"``, ``"webshop"`` or ``"sokoban"``.

    Returns:
        ParsedAction, also the pair ``(action, valid)``. Never raises for any ``str`` input.

    Raises:
        TypeError: ``text`` is not a ``str``.
        ValueError: unknown ``protocol``, or ``protocol="verl-agent"`` with an ``env`` that has no projection.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_action expects the decoded completion as str, got {type(text).__name__}")
    if check_protocol(protocol) == "verl-agent":
        return _project_verl_agent(text, env)
    actions = _ACTION.findall(text)
    think_match = _THINK.search(text)
    think = think_match.group(1).strip() if think_match else None
    if not actions:
        # "<action>go to desk" cut at max_completion_length: send what was written, still invalid.
        opened = _ACTION_OPEN.search(text)
        if opened:
            partial = text[opened.end():].strip()
            return ParsedAction(partial or fallback, False, "unclosed_action", think)
        return ParsedAction(fallback, False, "no_action", think)
    # Several actions: the last one is the model's final word; the row is still invalid.
    action = actions[-1].strip()
    if not action:
        return ParsedAction(fallback, False, "empty_action", think)
    if len(actions) > 1:
        return ParsedAction(action, False, "multiple_actions", think)
    if require_think and think_match is None:
        return ParsedAction(action, False, "no_think", think)
    return ParsedAction(action, True, "ok", think)


def _project_verl_agent(text: str, env: str | None) -> ParsedAction:
    """verl-agent's ``{alfworld,webshop,sokoban}_projection`` for one completion (see the module docstring)."""
    if env not in VERL_AGENT_ENVS:
        raise ValueError(f"parse_action(protocol='verl-agent') needs env= one of {list(VERL_AGENT_ENVS)}, got {env!r}")
    lowered = text.lower()
    start, end = lowered.find("<action>"), lowered.find("</action>")
    t_open, t_close = text.find("<think>"), text.find("</think>")
    think = text[t_open + 7:t_close].strip() if -1 < t_open < t_close else None
    has_think = t_open != -1 and t_close != -1  # case-sensitive, on the original text
    if env == "sokoban":
        if start == -1 or end == -1:
            return ParsedAction(0, False, "no_action", think, SOKOBAN_ACTION_NAMES[0])
        extracted = lowered[start + len("<action>"):end].strip()  # "" when </action> comes first
        action_id = next((i for word, i in SOKOBAN_ACTION_IDS.items() if word in extracted), None)
        if action_id is None:
            return ParsedAction(0, False, "no_move", think, SOKOBAN_ACTION_NAMES[0])
        valid, reason = (True, "ok") if has_think else (False, "no_think")
        return ParsedAction(action_id, valid, reason, think, SOKOBAN_ACTION_NAMES[action_id])
    if start == -1 or end == -1:
        return ParsedAction(lowered[-VERL_AGENT_TAIL_CHARS[env]:], False, "no_action", think)
    action = lowered[start + len("<action>"):end].strip()
    if not has_think:
        return ParsedAction(action, False, "no_think", think)
    if _CJK.search(text):
        return ParsedAction(action, False, "cjk", think)
    return ParsedAction(action, True, "ok", think)


def parse_for_env(env: Any, text: str, require_think: bool = True) -> ParsedAction:
    """Parse ``text`` as ``env`` asks: its ``protocol`` (default ``"gigpo-trl"``) and, under ``"verl-agent"``, the
    projection named by its ``name``; under ``"gigpo-trl"`` the env's ``invalid_action`` is the fallback, or the
    completion's last 30 characters when that is ``None`` (as the GiGPO reference sends)."""
    protocol = getattr(env, "protocol", "gigpo-trl")
    if protocol == "verl-agent":
        return parse_action(text, protocol=protocol, env=getattr(env, "name", None))
    fallback = getattr(env, "invalid_action", None)
    return parse_action(text, fallback=text[-30:] if fallback is None else fallback, require_think=require_think)
