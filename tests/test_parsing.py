import pytest

from gigpo_trl.parsing import parse_action
from gigpo_trl.prompts import build_messages, format_history


@pytest.mark.parametrize(
    "text, action, valid, reason",
    [
        ("<think>go</think><action>click[buy now]</action>", "click[buy now]", True, "ok"),
        ("<think>a</think>\n<action>  go to desk 1 \n</action>", "go to desk 1", True, "ok"),
        ("<THINK>a</THINK><Action>left</Action>", "left", True, "ok"),
        ("", "<invalid>", False, "no_action"),
        ("just text, no tags", "<invalid>", False, "no_action"),
        ("<think>x</think><action></action>", "<invalid>", False, "empty_action"),
        ("<think>x</think><action>   </action>", "<invalid>", False, "empty_action"),
        ("<think>x</think><action>up</action><action>down</action>", "down", False, "multiple_actions"),
        ("<action>up</action>", "up", False, "no_think"),
        ("<think>x</think><action>go to dre", "go to dre", False, "unclosed_action"),
        ("<think>x</think><action>", "<invalid>", False, "unclosed_action"),
        ("<think>移动</think><action>右 → right ✓</action>", "右 → right ✓", True, "ok"),
    ],
)
def test_parse_action_shapes(text, action, valid, reason):
    parsed = parse_action(text)
    assert (parsed.action, parsed.valid, parsed.reason) == (action, valid, reason)


def test_parse_action_fallback_and_no_think_option():
    assert parse_action("nothing", fallback="noop").action == "noop"
    relaxed = parse_action("<action>up</action>", require_think=False)
    assert relaxed.valid and relaxed.action == "up" and relaxed.think is None
    assert parse_action("<think> plan </think><action>up</action>").think == "plan"


def test_parse_action_rejects_non_str():
    with pytest.raises(TypeError, match="completion as str"):
        parse_action(b"<action>up</action>")


def test_history_window_rendering():
    text = format_history([("obs A", "left"), ("obs B", "right")])
    assert text == (
        "Your last 2 step(s), oldest first:\n[Step 1 observation]\nobs A\n[Step 1 action] left\n"
        "[Step 2 observation]\nobs B\n[Step 2 action] right\n"
    )
    assert format_history([]) == ""


def test_build_messages_uses_env_template():
    class Env:
        system_prompt = "SYS"
        prompt_template = "{instruction}|{history}|{observation}|{admissible_actions}|{turn}/{max_turns}"

    messages = build_messages(Env(), "find it", "room", [("o0", "a0")], turn=1, max_turns=5,
                              admissible_actions=["a", "b"])
    assert messages[0] == {"role": "system", "content": "SYS"}
    assert messages[1]["content"] == (
        "find it|Your last 1 step(s), oldest first:\n[Step 1 observation]\no0\n[Step 1 action] a0\n|room|"
        "Admissible actions: 'a', 'b'\n|1/5"
    )
