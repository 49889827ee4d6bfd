"""verl-agent's projection: one completion -> the action sent to the environment and its validity bit.

The projection functions of the paper's code (``env_package/{alfworld,webshop,sokoban}/projection.py``), rule for
rule: lower-case the whole completion; the action is the text between the first ``<action>`` and the first
``</action>`` of the lower-cased text, stripped (empty when ``</action>`` comes first); without either tag the env
gets the last 30 (ALFWorld) / 20 (WebShop) characters of the lower-cased text and the turn is invalid; the turn is
also invalid when ``<think>`` or ``</think>`` is missing from the *original* text (case-sensitive) or, for ALFWorld
and WebShop, when it contains a CJK ideograph (U+4E00-U+9FFF). Several blocks, an empty block or a non-admissible
action stay valid. Sokoban maps the extracted text to an action id by substring over ``up, down, left, right,
still`` (first match in that order; ``still`` is id 0, a no-op that counts as valid); no tags or no match gives id 0,
invalid; Sokoban has no CJK check.
"""

from __future__ import annotations

import re

from ..base import ParsedAction

_CJK = re.compile("[\u4e00-\u9fff]")

#: Characters of the lower-cased completion sent to the env when a completion has no action tags.
TAIL_CHARS = {"alfworld": 30, "webshop": 20}
#: verl-agent's Sokoban action pool, in its lookup order (substring match, first hit wins).
SOKOBAN_ACTION_IDS = {"up": 1, "down": 2, "left": 3, "right": 4, "still": 0}
#: How verl-agent's Sokoban memory writes an action id into the prompt's history (env_manager.py ACTION_LOOKUP).
SOKOBAN_ACTION_NAMES = {0: "Still", 1: "Up", 2: "Down", 3: "Left", 4: "Right"}
#: The environments that have a projection.
PROJECTED_ENVS = ("alfworld", "webshop", "sokoban")


def project(text: str, env: str) -> ParsedAction:
    """verl-agent's ``{env}_projection`` of one completion (see the module docstring).

    Args:
        text: the decoded completion (any content: empty, non-ASCII, cut at the length limit).
        env: whose projection: ``"alfworld"``, ``"webshop"`` or ``"sokoban"``.

    Returns:
        ParsedAction, also the projection's pair ``(action, valid)``; ``action`` is an ``int`` id for Sokoban and
        ``history_action`` its name (``"Up"`` ... ``"Still"``). Never raises for any ``str`` text.

    Raises:
        TypeError: ``text`` is not a ``str``.
        ValueError: ``env`` has no projection (the message names it and the choices).
    """
    if not isinstance(text, str):
        raise TypeError(f"the projection expects the decoded completion as str, got {type(text).__name__}")
    if env not in PROJECTED_ENVS:
        raise ValueError(f"verl-agent's projection needs env= one of {list(PROJECTED_ENVS)}, got {env!r}")
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
        return ParsedAction(lowered[-TAIL_CHARS[env]:], False, "no_action", think)
    action = lowered[start + len("<action>"):end].strip()
    if not has_think:
        return ParsedAction(action, False, "no_think", think)
    if _CJK.search(text):
        return ParsedAction(action, False, "cjk", think)
    return ParsedAction(action, True, "ok", think)


__all__ = ["PROJECTED_ENVS", "SOKOBAN_ACTION_IDS", "SOKOBAN_ACTION_NAMES", "TAIL_CHARS", "project"]
