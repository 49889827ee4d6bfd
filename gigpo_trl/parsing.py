"""Parse a model completion into an environment action.

The expected format is ``<think>reasoning</think><action>the action</action>`` (GiGPO paper, App. prompts).
Any other shape is *invalid*: the row is penalised by ``invalid_action_penalty`` in the advantage, and the
environment still receives a fallback string, as the GiGPO reference does, so the episode goes on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)
_ACTION = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_ACTION_OPEN = re.compile(r"<action>", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedAction:
    """Result of :func:`parse_action`.

    Attributes:
        action (`str`): what is sent to the environment; ``fallback`` when nothing usable was found.
        valid (`bool`): ``True`` only for exactly one non-empty ``<action>`` block after a ``<think>`` block.
        reason (`str`): ``"ok"`` or why the completion is invalid (``"no_action"``, ``"empty_action"``,
            ``"multiple_actions"``, ``"no_think"``, ``"unclosed_action"``).
        think (`str` or `None`): the reasoning text, if any.
    """

    action: str
    valid: bool
    reason: str
    think: str | None = None


def parse_action(text: str, fallback: str = "<invalid>", require_think: bool = True) -> ParsedAction:
    """Extract the action of one completion.

    Args:
        text: the decoded completion (any content: empty, non-ASCII, cut at the length limit).
        fallback: the string sent to the environment when no action can be extracted.
        require_think: mark completions without a ``<think>…</think>`` block invalid (the action, if present,
            is still sent to the environment).

    Returns:
        ParsedAction. Never raises for any ``str`` input.

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_action expects the decoded completion as str, got {type(text).__name__}")
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
