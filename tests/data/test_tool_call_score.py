"""The tool-call scorer against hand-written turns: argument types compared as values, key order, several calls in
order or as a set, malformed output, text around the call, the JSON form, turns that should not call."""

from __future__ import annotations

import pytest

from leap_finetune.data.tool_call_score import (
    aggregate,
    calls_in_text,
    parse_turn,
    score_calls,
    score_turn,
    served_calls,
)
from leap_finetune.data.tool_calls import ToolCall

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
WEATHER = ToolCall("get_weather", {"city": "Oslo", "days": 3})
TIME = ToolCall("get_time", {"zone": "CET"})


def call(text: str) -> str:
    return f"{START}[{text}]{END}"


def test_arguments_are_compared_as_values():
    assert score_turn(call('get_weather(city="Oslo", days=3)'), [WEATHER]).exact == 1.0
    assert score_turn(call('get_weather(days=3.0, city="Oslo")'), [WEATHER]).exact == 1.0  # 3 == 3.0, order free
    assert score_turn(call('get_weather(city="Oslo", days="3")'), [WEATHER]).exact == 0.0  # a string is not 3
    flag = ToolCall("set", {"on": True, "level": 1})
    assert score_turn(call("set(on=1, level=1)"), [flag]).exact == 0.0  # a bool is not a number
    assert score_turn(call("set(level=1, on=True)"), [flag]).exact == 1.0
    nested = ToolCall("book", {"who": {"name": "Ada", "seats": 2}, "tags": ["a", "b"]})
    assert score_turn(call('book(tags=["a", "b"], who={"seats": 2.0, "name": "Ada"})'), [nested]).exact == 1.0
    assert score_turn(call('book(tags=["b", "a"], who={"seats": 2, "name": "Ada"})'), [nested]).exact == 0.0


def test_partial_credit_names_and_argument_f1():
    wrong_value = score_turn(call('get_weather(city="Bergen", days=3)'), [WEATHER])
    assert (wrong_value.exact, wrong_value.name, wrong_value.argument_f1) == (0.0, 1.0, 0.5)
    wrong_name = score_turn(call('get_forecast(city="Oslo", days=3)'), [WEATHER])
    assert wrong_name.name == 0.0 and wrong_name.argument_f1 == 0.0
    extra_argument = score_turn(call('get_weather(city="Oslo", days=3, unit="C")'), [WEATHER])
    assert extra_argument.exact == 0.0 and extra_argument.argument_f1 == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_several_calls_as_a_set_or_in_order():
    both = call('get_time(zone="CET"), get_weather(city="Oslo", days=3)')
    assert score_turn(both, [WEATHER, TIME], order="set").exact == 1.0
    swapped = score_turn(both, [WEATHER, TIME], order="ordered")
    assert swapped.exact == 0.0 and swapped.name == 0.0
    one_missing = score_turn(call('get_weather(city="Oslo", days=3)'), [WEATHER, TIME])
    assert one_missing.exact == 0.0 and one_missing.name == 0.5
    one_extra = score_turn(both, [WEATHER])
    assert one_extra.exact == 0.0 and one_extra.name == 0.5
    # two blocks in one turn count as one list of calls
    assert score_turn(call('get_weather(city="Oslo", days=3)') + call('get_time(zone="CET")'), [WEATHER, TIME]).exact
    with pytest.raises(ValueError):
        score_turn(both, [WEATHER], order="random")


def test_malformed_output_and_other_formats_do_not_parse():
    for text in (
        f'{START}[get_weather(city="Oslo", days=3){END[:-2]}',  # no closing marker
        call('get_weather("Oslo", 3)'),  # positional arguments
        call("get_weather(city=Oslo)"),  # not a literal
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}</tool_call>',  # Hermes
    ):
        scored = score_turn(text, [WEATHER])
        assert scored.parsed == 0.0 and scored.exact == 0.0 and scored.problem, text
    # text around the call is fine (LFM2.5 may think first; a sentence before it)
    weather = call('get_weather(city="Oslo", days=3)')
    around = f"<think>Oslo, three days.</think>Let me check. {weather} One moment."
    assert score_turn(around, [WEATHER]).exact == 1.0


def test_the_json_form_between_the_markers():
    text = f'{START}[{{"name": "get_weather", "arguments": {{"days": 3, "city": "Oslo"}}}}]{END}'
    assert parse_turn(text) == ([WEATHER], None)
    assert score_turn(text, [WEATHER]).exact == 1.0
    as_string = f'{START}[{{"name": "get_weather", "arguments": "{{\\"city\\": \\"Oslo\\", \\"days\\": 3}}"}}]{END}'
    assert score_turn(as_string, [WEATHER]).exact == 1.0  # (OpenAI's arguments as a JSON string)


def test_turns_that_should_not_call():
    assert score_turn("It is sunny in Oslo.", []).no_call == 1.0
    called = score_turn(call('get_weather(city="Oslo", days=3)'), [])
    assert called.no_call == 0.0 and called.exact == 0.0 and called.name is None
    broken = score_turn(f"{START}[oops", [])
    assert broken.no_call == 0.0 and broken.parsed == 0.0


def test_aggregate_means_each_over_the_rows_it_applies_to():
    rows = [
        score_turn(call('get_weather(city="Oslo", days=3)'), [WEATHER]),  # exact
        score_turn(call('get_weather(city="Bergen", days=3)'), [WEATHER]),  # name right, half the arguments
        score_turn("No call needed.", []),  # right not to call
        score_turn(call("get_weather("), [WEATHER]),  # does not parse
    ]
    found = aggregate(rows)
    assert found["exact"] == pytest.approx(2 / 4)
    assert found["parsed"] == pytest.approx(3 / 4)
    assert found["name"] == pytest.approx((1 + 1 + 0) / 3)
    assert found["argument_f1"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert found["no_call"] == 1.0


def test_a_servers_tool_calls_are_scored_like_the_same_calls_in_text():
    served, problem = served_calls([("get_weather", '{"days": 3.0, "city": "Oslo"}')])
    assert problem is None and score_calls(served, problem, [WEATHER]).exact == 1.0
    _, problem = served_calls([("get_weather", '{"city": "Oslo"')])
    assert "not JSON" in problem and score_calls([], problem, [WEATHER]).parsed == 0.0
    assert "not a JSON object" in served_calls([("get_weather", "[1]")])[1]
    # a server whose parser left the calls in the text: with the markers, or with them removed as special tokens
    assert calls_in_text(call('get_weather(city="Oslo")'))
    assert calls_in_text(' [get_weather(city="Oslo", days=3)] ')
    assert not calls_in_text("[1, 2] are the numbers") and not calls_in_text("It is sunny.")


def test_the_saved_response_template_reads_calls_as_our_parser_does():
    """transformers' parser with the template every LFM tokenizer gets (models/response_template.py) returns the
    calls our parser reads, for every kind of argument value, with the text around them as content."""
    import json

    from leap_finetune.models.loading import load_tokenizer

    tokenizer = load_tokenizer("tiny-lfm2")
    assert tokenizer.response_template is not None
    prefix = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    turns = [
        call('get_weather(city="Oslo", days=3)'),
        "Let me look." + call('f(a="it\'s \\"q\\"\\n", b=-1.5, c=[1, {"k": None}], d=True), g()') + " Done.",
        "<think>which tool?</think>" + call('get_weather(city="Ünïcode")'),
        "No call here.",
    ]
    for turn in turns:
        ids = tokenizer(turn + "<|im_end|>", add_special_tokens=False)["input_ids"]
        parsed = tokenizer.parse_response(ids, prefix=prefix)
        ours, problem = parse_turn(turn)
        assert problem is None
        theirs = [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.get("tool_calls", [])]
        assert theirs == [(c.name, c.arguments) for c in ours], turn
        assert json.dumps(theirs)  # (arguments are JSON values: what a server returns)
        if "Let me look." in turn:
            assert parsed["content"] == "Let me look. Done."
