"""LFM bracket notation: formatting round-trips through Python's parser; parsing, markers and
foreign formats."""

from __future__ import annotations

import ast

import pytest

from leap_finetune.data.tool_calls import (
    ToolCall,
    ToolCallSyntaxError,
    find_tool_calls,
    foreign_format,
    format_calls,
    format_value,
    parse_calls,
    tool_call_is_valid,
)

VALUES = [
    "Boston",
    'say "hi"',
    "it's",
    "line one\nline two\r\n\ttabbed",
    "back\\slash \\n not a newline",
    "ünïcødé ✓ 東京 😀",
    "",
    "\x00\x1f control",
    3,
    -7,
    0,
    2.5,
    1e-9,
    True,
    False,
    None,
    [1, "two", [3, None], {"k": True}],
    {"nested": {"list": [1, 2], "q": 'a"b'}, "empty": {}},
    [],
]


@pytest.mark.parametrize("value", VALUES, ids=[repr(v)[:30] for v in VALUES])
def test_formatted_values_are_python_literals_that_round_trip(value):
    assert ast.literal_eval(format_value(value)) == value


def test_calls_round_trip_through_the_parser():
    calls = [
        ToolCall("get_weather", {"location": "Boston, MA", "days": 3, "units": None}),
        ToolCall("search", {"query": 'he said "yes"\n', "filters": {"lang": ["en", "de"]}, "exact": False}),
    ]
    text = format_calls(calls)
    assert text.startswith('<|tool_call_start|>[get_weather(location="Boston, MA", days=3, units=None), search(')
    assert text.endswith(")]<|tool_call_end|>")
    assert parse_calls(text.removeprefix("<|tool_call_start|>").removesuffix("<|tool_call_end|>")) == calls


def test_the_spec_example_parses():
    assert parse_calls('[get_weather(location="Boston")]') == [ToolCall("get_weather", {"location": "Boston"})]
    assert parse_calls("[a.b(x=1), noargs()]") == [ToolCall("a.b", {"x": 1}), ToolCall("noargs", {})]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('get_weather(location="Boston")', "expected a list of calls"),
        ('[get_weather("Boston")]', "positional arguments"),
        ("[get_weather]", "is not a call"),
        ("[get_weather(location=city)]", "is not a literal"),
        ("[get_weather(location=]", "not valid Python"),
        ("[f(**kw)]", "**kwargs"),
        ("[(lambda: 1)()]", "is not a function name"),
    ],
)
def test_bad_bracket_notation(text, message):
    with pytest.raises(ToolCallSyntaxError, match=message.replace("*", r"\*")):
        parse_calls(text)


@pytest.mark.parametrize(
    ("content", "calls", "before", "problem"),
    [
        ("<|tool_call_start|>[f(a=1)]<|tool_call_end|>", 1, "", None),
        ("Let me check.<|tool_call_start|>[f(a=1)]<|tool_call_end|>", 1, "Let me check.", None),
        ("<think>plan</think><|tool_call_start|>[f(a=1)]<|tool_call_end|>", 1, "", None),
        ("<|tool_call_start|>[f(a=1)]<|tool_call_end|> then <|tool_call_start|>[g()]<|tool_call_end|>", 2, "", None),
        ("no call at all", 0, "no call at all", None),
        ("<|tool_call_start|>[f(a=1)]", 0, "", "without a closing"),
        ("[f(a=1)]<|tool_call_end|>", 0, "", "without a <|tool_call_start|> before it"),
        ("<|tool_call_start|>[f(a=1)<|tool_call_start|>]<|tool_call_end|>", 0, "", "a second"),
        ('<|tool_call_start|>get_weather(city="x")<|tool_call_end|>', 0, "", "does not parse"),
    ],
)
def test_find_tool_calls(content, calls, before, problem):
    blocks = find_tool_calls(content)
    assert len(blocks.calls) == calls
    if problem is None:
        assert blocks.problem is None and blocks.text_before == before
    else:
        assert problem in blocks.problem


@pytest.mark.parametrize(
    ("content", "name"),
    [
        ('<tool_call>{"name": "f", "arguments": {}}</tool_call>', "Hermes/Qwen"),
        ('[TOOL_CALLS] [{"name": "f", "arguments": {}}]', "Mistral"),
        ('<function_call>{"name": "f"}</function_call>', "<function_call>"),
        ('<functioncall> {"name": "f"}', "<function_call>"),
        ('<function=get_weather>{"city": "x"}</function>', "Llama <function=name>"),
        ('<|python_tag|>get_weather.call(city="x")', "python_tag"),
        ('{"name": "get_weather", "arguments": {"city": "x"}}', "raw JSON function-call"),
        ('[{"name": "a", "parameters": {}}, {"name": "b", "arguments": {}}]', "raw JSON function-call"),
    ],
)
def test_foreign_formats_are_recognised(content, name):
    assert name in foreign_format(content)


@pytest.mark.parametrize(
    "content", ['{"temperature": 72}', "It's sunny.", "<|tool_call_start|>[f(a=1)]<|tool_call_end|>", '{"name": "Ada"}']
)
def test_ordinary_content_is_not_foreign(content):
    assert foreign_format(content) is None


@pytest.mark.parametrize(
    ("completion", "tools", "valid"),
    [
        ('<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>', None, True),
        ('<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>', ["get_weather"], True),
        (
            '<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>',
            [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
            True,
        ),
        ('<|tool_call_start|>[get_wether(city="Oslo")]<|tool_call_end|>', [{"name": "get_weather"}], False),
        ('<|tool_call_start|>[get_weather(city="Oslo")]', None, False),
        ('<|tool_call_start|>[get_weather("Oslo")]<|tool_call_end|>', None, False),
        ("It is cold in Oslo.", None, False),
        ('<tool_call>{"name": "get_weather"}</tool_call>', None, False),
    ],
)
def test_tool_call_is_valid(completion, tools, valid):
    assert tool_call_is_valid(completion, tools=tools) is valid


def test_reward_helper_is_importable_from_rl():
    from leap_finetune.rl.rewards import tool_call_is_valid as reward

    assert reward is tool_call_is_valid
