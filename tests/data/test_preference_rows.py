"""DPO and KTO row contracts: every shape the spec allows, every validation rule with its message."""

from __future__ import annotations

import json

import pytest

from leap_finetune.data.preference_rows import check_dpo_row, check_kto_row
from leap_finetune.data.readers import SourceRow

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text: {"role": "assistant", "content": text}  # noqa: E731


def dpo(data: dict, family: str = "lfm2", text_table: bool = False):
    return check_dpo_row(SourceRow("prefs.jsonl", "line 4", data, from_text_table=text_table), family=family)


def kto(data: dict, text_table: bool = False):
    return check_kto_row(SourceRow("kto.csv", "row 2 (line 3)", data, from_text_table=text_table), family="lfm2")


def test_dpo_plain_strings_become_one_user_and_one_assistant_turn():
    row, problems, _ = dpo({"prompt": "Hi?", "chosen": "Hello.", "rejected": "Go away."})
    assert problems == []
    assert (row.prompt, row.chosen, row.rejected) == ([U("Hi?")], [A("Hello.")], [A("Go away.")])


def test_dpo_multi_turn_prompt_and_multi_message_completions():
    prompt = [{"role": "system", "content": "Be brief."}, U("Hi"), A("Hello."), U("2+2?")]
    row, problems, _ = dpo({"prompt": prompt, "chosen": [A("4"), A("Anything else?")], "rejected": [A("5")]})
    assert problems == []
    assert row.prompt == prompt and row.chosen == [A("4"), A("Anything else?")]


def test_dpo_implicit_prompt_is_the_shared_prefix():
    shared = [{"role": "system", "content": "Be brief."}, U("2+2?")]
    row, problems, _ = dpo({"chosen": shared + [A("4")], "rejected": shared + [A("5")]})
    assert problems == []
    assert row.implicit_prompt and row.prompt == shared and row.chosen == [A("4")] and row.rejected == [A("5")]


def test_dpo_implicit_prompt_never_ends_with_an_assistant_turn():
    chosen = [U("Hi"), A("Hello."), U("2+2?"), A("4")]
    rejected = [U("Hi"), A("Hello."), U("2+2?"), A("5")]
    row, problems, _ = dpo({"chosen": chosen, "rejected": rejected})
    assert problems == [] and row.prompt == chosen[:3]


def test_dpo_tool_calls_in_completions_are_normalised():
    calls = [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]
    row, problems, warnings = dpo(
        {
            "prompt": [U("Weather?")],
            "chosen": [{"role": "assistant", "content": None, "tool_calls": calls}],
            "rejected": [A("No idea.")],
        }
    )
    assert problems == []
    assert row.chosen[0]["content"] == '<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>'
    assert [w.kind for w in warnings] == ["converted_tool_calls"]


DPO_REJECTED = [
    ("missing rejected", {"prompt": "q", "chosen": "a"}, "rejected", "missing or empty"),
    ("empty chosen", {"prompt": "q", "chosen": "", "rejected": "b"}, "chosen", "missing or empty"),
    ("identical", {"prompt": "q", "chosen": "same", "rejected": "same"}, "chosen, rejected", "identical"),
    (
        "user turn in a completion",
        {"prompt": [U("q")], "chosen": [A("a"), U("more?")], "rejected": [A("b")]},
        "chosen[1].role",
        "completions hold only assistant messages",
    ),
    ("mixed shapes", {"prompt": "q", "chosen": [A("a")], "rejected": "b"}, "prompt, chosen, rejected", "mixed shapes"),
    (
        "prompt ends with the assistant",
        {"prompt": [U("q"), A("partial")], "chosen": [A("a")], "rejected": [A("b")]},
        "prompt[1].role",
        "ends with an assistant turn",
    ),
    ("implicit prompt needs conversations", {"chosen": "a", "rejected": "b"}, "prompt", "a `prompt` is required"),
    ("nothing shared", {"chosen": [U("x"), A("a")], "rejected": [U("y"), A("b")]}, "prompt", "share no leading"),
    (
        "bad role",
        {"prompt": [{"role": "usr", "content": "q"}], "chosen": [A("a")], "rejected": [A("b")]},
        "prompt[0].role",
        "did you mean 'user'",
    ),
    ("not an object", ["q", "a", "b"], "<row>", "expected an object"),
    (
        "foreign tool format",
        {"prompt": "q", "chosen": '<tool_call>{"name": "f", "arguments": {}}</tool_call>', "rejected": "b"},
        "prompt+chosen[1].content",
        "Hermes/Qwen",
    ),
]


@pytest.mark.parametrize(("name", "data", "field", "message"), DPO_REJECTED, ids=[r[0] for r in DPO_REJECTED])
def test_dpo_rejected_rows(name, data, field, message):
    row, problems, _ = dpo(data)
    assert row is None
    assert any(p.field == field and message in p.problem for p in problems), [p.format() for p in problems]
    assert all(p.file == "prefs.jsonl" and p.location == "line 4" for p in problems)


@pytest.mark.parametrize(
    ("raw", "label"), [(True, True), (False, False), ("true", True), ("False", False), (" TRUE ", True)]
)
def test_kto_labels(raw, label):
    row, problems, _ = kto({"prompt": "q", "completion": "a", "label": raw})
    assert problems == [] and row.label is label


KTO_REJECTED = [
    ("label missing", {"prompt": "q", "completion": "a"}, "label", "missing"),
    ("label a number", {"prompt": "q", "completion": "a", "label": 1}, "label", "got a number (1)"),
    ("label other text", {"prompt": "q", "completion": "a", "label": "yes"}, "label", "got a string ('yes')"),
    ("completion missing", {"prompt": "q", "label": True}, "completion", "missing or empty"),
    (
        "system turn in the completion",
        {"prompt": [U("q")], "completion": [{"role": "system", "content": "x"}], "label": True},
        "completion[0].role",
        "only assistant messages",
    ),
]


@pytest.mark.parametrize(("name", "data", "field", "message"), KTO_REJECTED, ids=[r[0] for r in KTO_REJECTED])
def test_kto_rejected_rows(name, data, field, message):
    row, problems, _ = kto(data)
    assert row is None
    assert any(p.field == field and message in p.problem for p in problems), [p.format() for p in problems]
    assert problems[0].location == "row 2 (line 3)"


def test_csv_rows_hold_messages_as_json_text_and_labels_as_text():
    data = {"prompt": json.dumps([U("q")]), "completion": json.dumps([A("a")]), "label": "true"}
    row, problems, _ = kto(data, text_table=True)
    assert problems == [] and row.prompt == [U("q")] and row.label is True
