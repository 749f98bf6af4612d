"""Every tool-use rule, for both LFM families: valid, converted, warned, rejected."""

from __future__ import annotations

import json

import pytest

from leap_finetune.data.readers import SourceRow
from leap_finetune.data.sft_rows import check_sft_row

CALL = '<|tool_call_start|>[get_weather(location="Boston")]<|tool_call_end|>'
TOOL_LIST = 'List of tools: <|tool_list_start|>[{"name": "get_weather", "parameters": {}}]<|tool_list_end|>'
TOOL_LIST_PLAIN = 'List of tools: [{"name": "get_weather", "parameters": {}}]'


def conv(*turns, **columns) -> dict:
    return {
        "messages": [{"role": r, "content": c} if isinstance(c, str) else {"role": r, **c} for r, c in turns],
        **columns,
    }


def check(row: dict, family: str):
    return check_sft_row(SourceRow("data.jsonl", "line 7", row), family=family)


SPEC_EXAMPLE = conv(
    ("system", TOOL_LIST),
    ("user", "What's the weather in Boston?"),
    ("assistant", CALL),
    ("tool", '{"temperature": 72}'),
    ("assistant", "It's 72 F and sunny in Boston."),
)


@pytest.mark.parametrize("family", ["lfm2", "lfm2.5"])
def test_a_valid_multi_turn_tool_conversation(family):
    row = (
        SPEC_EXAMPLE
        if family == "lfm2"
        else conv(("system", TOOL_LIST_PLAIN), *[(m["role"], m["content"]) for m in SPEC_EXAMPLE["messages"][1:]])
    )
    conversation, problems, warnings = check(row, family)
    assert problems == [] and warnings == []
    assert conversation.messages[2]["content"] == CALL


# (name, row, family, expected warning kind or None, expected content check (index, content) or None)
WARNED = [
    (
        "response markers pre-baked (lfm2)",
        conv(
            ("system", TOOL_LIST),
            ("user", "q"),
            ("assistant", CALL),
            ("tool", "<|tool_response_start|>72<|tool_response_end|>"),
            ("assistant", "72"),
        ),
        "lfm2",
        "tool_response_markers",
        (3, "72"),
    ),
    (
        "response markers pre-baked (lfm2.5)",
        conv(
            ("user", "q"),
            ("assistant", CALL),
            ("tool", "<|tool_response_start|>72<|tool_response_end|>"),
            ("assistant", "72"),
        ),
        "lfm2.5",
        "tool_response_markers",
        (2, "72"),
    ),
    (
        "lfm2.5 strips tool-list markers",
        conv(("system", TOOL_LIST), ("user", "q"), ("assistant", "a")),
        "lfm2.5",
        "lfm25_tool_list_markers",
        (0, TOOL_LIST_PLAIN),
    ),
    (
        "lfm2 tool list without markers",
        conv(("system", TOOL_LIST_PLAIN), ("user", "q"), ("assistant", "a")),
        "lfm2",
        "lfm2_missing_tool_list_markers",
        (0, TOOL_LIST_PLAIN),
    ),
    (
        "lfm2 text before the call",
        conv(("user", "q"), ("assistant", "Let me check. " + CALL), ("tool", "72"), ("assistant", "72")),
        "lfm2",
        "text_before_tool_call",
        None,
    ),
    (
        "unknown function",
        conv(
            ("user", "q"),
            ("assistant", "<|tool_call_start|>[get_time()]<|tool_call_end|>"),
            ("tool", "noon"),
            ("assistant", "noon"),
            tools=[{"name": "get_weather"}],
        ),
        "lfm2",
        "unknown_function",
        None,
    ),
]


@pytest.mark.parametrize(("name", "row", "family", "kind", "content"), WARNED, ids=[w[0] for w in WARNED])
def test_warned_and_normalised(name, row, family, kind, content):
    conversation, problems, warnings = check(row, family)
    assert problems == []
    assert [w.kind for w in warnings] == [kind]
    assert warnings[0].location == "line 7"
    if content:
        index, text = content
        assert conversation.messages[index]["content"] == text


def test_text_before_the_call_is_fine_for_lfm2_5():
    row = conv(("user", "q"), ("assistant", "Let me check. " + CALL), ("tool", "72"), ("assistant", "72"))
    assert check(row, "lfm2.5")[2] == []


STRUCTURED = [
    ("dict arguments", {"location": "Boston", "days": 3}, '[get_weather(location="Boston", days=3)]'),
    (
        "JSON-string arguments",
        json.dumps({"location": "Boston", "metric": True, "extra": None}),
        '[get_weather(location="Boston", metric=True, extra=None)]',
    ),
    (
        "escaping",
        {"q": 'say "hi"\nnow \\ ok', "tags": ["a", {"b": 1.5}]},
        '[get_weather(q="say \\"hi\\"\\nnow \\\\ ok", tags=["a", {"b": 1.5}])]',
    ),
    ("unicode", {"city": "Zürich 東京"}, '[get_weather(city="Zürich 東京")]'),
    ("no arguments", "", "[get_weather()]"),
]


@pytest.mark.parametrize("family", ["lfm2", "lfm2.5"])
@pytest.mark.parametrize(("name", "arguments", "expected"), STRUCTURED, ids=[s[0] for s in STRUCTURED])
def test_structured_tool_calls_are_converted(family, name, arguments, expected):
    calls = [{"type": "function", "function": {"name": "get_weather", "arguments": arguments}}]
    row = conv(
        ("user", "q"), ("assistant", {"content": None, "tool_calls": calls}), ("tool", "72"), ("assistant", "ok")
    )
    conversation, problems, warnings = check(row, family)
    assert problems == []
    assert [w.kind for w in warnings] == ["converted_tool_calls"]
    message = conversation.messages[1]
    assert "tool_calls" not in message
    assert message["content"] == f"<|tool_call_start|>{expected}<|tool_call_end|>"


def test_several_structured_calls_and_the_flat_form():
    calls = [{"name": "a", "arguments": {"x": 1}}, {"function": {"name": "b", "arguments": "{}"}}]
    row = conv(
        ("user", "q"),
        ("assistant", {"content": "", "tool_calls": calls}),
        ("tool", "1"),
        ("tool", "2"),
        ("assistant", "done"),
    )
    conversation, problems, _ = check(row, "lfm2")
    assert problems == []
    assert conversation.messages[1]["content"] == "<|tool_call_start|>[a(x=1), b()]<|tool_call_end|>"


REJECTED = [
    (
        "Hermes XML",
        conv(("user", "q"), ("assistant", '<tool_call>{"name": "f", "arguments": {}}</tool_call>')),
        "messages[1].content",
        "Hermes/Qwen",
    ),
    (
        "Mistral",
        conv(("user", "q"), ("assistant", '[TOOL_CALLS] [{"name": "f", "arguments": {}}]')),
        "messages[1].content",
        "Mistral",
    ),
    (
        "function_call tags",
        conv(("user", "q"), ("assistant", '<function_call>{"name": "f"}</function_call>')),
        "messages[1].content",
        "<function_call>",
    ),
    (
        "raw JSON call",
        conv(("user", "q"), ("assistant", '{"name": "f", "arguments": {"a": 1}}')),
        "messages[1].content",
        "raw JSON function-call object",
    ),
    (
        "positional argument",
        conv(("user", "q"), ("assistant", '<|tool_call_start|>[f("x")]<|tool_call_end|>')),
        "messages[1].content",
        "positional arguments",
    ),
    (
        "not a list",
        conv(("user", "q"), ("assistant", "<|tool_call_start|>f(a=1)<|tool_call_end|>")),
        "messages[1].content",
        "expected a list of calls",
    ),
    (
        "unclosed marker",
        conv(("user", "q"), ("assistant", "<|tool_call_start|>[f(a=1)]")),
        "messages[1].content",
        "without a closing",
    ),
    (
        "stray end marker",
        conv(("user", "q"), ("assistant", "[f(a=1)]<|tool_call_end|>")),
        "messages[1].content",
        "without a <|tool_call_start|>",
    ),
    (
        "call with no result before the next user turn",
        conv(("user", "q"), ("assistant", CALL), ("user", "and?"), ("assistant", "sunny")),
        "messages[1].content",
        "no role 'tool' result before messages[2]",
    ),
    (
        "tool message with no call",
        conv(("user", "q"), ("tool", "72"), ("assistant", "72")),
        "messages[1]",
        "no assistant tool call before it",
    ),
    (
        "tool message after a plain answer",
        conv(("user", "q"), ("assistant", "hm"), ("tool", "72"), ("assistant", "72")),
        "messages[2]",
        "no assistant tool call before it",
    ),
    (
        "bad JSON arguments",
        conv(
            ("user", "q"),
            ("assistant", {"content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}),
            ("tool", "1"),
            ("assistant", "ok"),
        ),
        "messages[1].tool_calls[0].function.arguments",
        "does not parse",
    ),
    (
        "tool_calls without a name",
        conv(
            ("user", "q"),
            ("assistant", {"content": "", "tool_calls": [{"function": {"arguments": {}}}]}),
            ("tool", "1"),
            ("assistant", "ok"),
        ),
        "messages[1].tool_calls[0]",
        "name",
    ),
    (
        "both structured and bracket calls",
        conv(
            ("user", "q"),
            ("assistant", {"content": CALL, "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}),
            ("tool", "1"),
            ("assistant", "ok"),
        ),
        "messages[1].tool_calls",
        "keep one",
    ),
    (
        "tools twice",
        conv(("system", TOOL_LIST), ("user", "q"), ("assistant", "a"), tools=[{"name": "get_weather"}]),
        "messages[0].content",
        "given twice",
    ),
    ("tools not a list", conv(("user", "q"), ("assistant", "a"), tools={"name": "x"}), "tools", "expected a list"),
]


@pytest.mark.parametrize("family", ["lfm2", "lfm2.5"])
@pytest.mark.parametrize(("name", "row", "field", "message"), REJECTED, ids=[r[0] for r in REJECTED])
def test_rejected_with_file_row_field_and_fix(family, name, row, field, message):
    conversation, problems, _ = check(row, family)
    assert conversation is None and problems, name
    text = [p.format() for p in problems]
    assert any(p.field == field and message in p.problem for p in problems), text
    assert all(p.file == "data.jsonl" and p.location == "line 7" for p in problems)


def test_foreign_format_errors_say_what_to_write_instead():
    row = conv(("user", "q"), ("assistant", '<tool_call>{"name": "f", "arguments": {}}</tool_call>'))
    [problem] = check(row, "lfm2")[1]
    assert '<|tool_call_start|>[name(key="value")]<|tool_call_end|>' in problem.problem


def test_a_call_that_ends_the_conversation_is_a_valid_target():
    assert check(conv(("user", "q"), ("assistant", CALL)), "lfm2")[1] == []


def test_other_model_families_keep_structured_tool_calls_for_their_own_template():
    calls = [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]
    row = conv(("user", "q"), ("assistant", {"content": "", "tool_calls": calls}), ("tool", "1"), ("assistant", "ok"))
    conversation, problems, warnings = check(row, "other")
    assert problems == [] and warnings == []
    assert conversation.messages[1]["tool_calls"] == calls


def test_tools_column_from_csv_json_text():
    row = {
        "messages": json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]),
        "tools": json.dumps([{"name": "get_weather", "parameters": {}}]),
    }
    conversation, problems, _ = check_sft_row(
        SourceRow("d.csv", "row 1 (line 2)", row, from_text_table=True), family="lfm2"
    )
    assert problems == [] and conversation.tools == [{"name": "get_weather", "parameters": {}}]


def test_every_warning_is_explained_in_the_tool_calling_docs():
    from leap_finetune.data.tool_use import WARNINGS
    from tests.conftest import REPO

    page = (REPO / "docs" / "tool-calling.md").read_text()
    for kind in WARNINGS:
        assert f"`{kind}`" in page, kind
