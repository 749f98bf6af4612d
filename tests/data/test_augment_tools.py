"""`dataset.augment_tools` on SFT rows: a training row's tool definitions (the `tools` column, or the system prompt's
JSON list) and every call of its assistant turns are shown under the same disguise, so what is trained is a
consistent conversation with other names; evaluation rows keep the real tools; the data report counts the rows; the
mistakes (another training type, no row with definitions) are refused with where and how to fix."""

from __future__ import annotations

import io
import json
import random
import re

from rich.console import Console

from leap_finetune.api import validate_config
from leap_finetune.data.sft_rows import Conversation
from leap_finetune.data.tool_calls import find_tool_calls
from leap_finetune.data.tool_disguise import disguise_conversation
from tests.conftest import invoke, row_texts, tiny_config, write_config, write_jsonl

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "the city"},
                                          "unit": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
]  # fmt: skip


def _row(i: int) -> dict:
    return {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": f"weather and time in city{i}?"},
            {"role": "assistant", "content": f'<|tool_call_start|>[get_weather(city="city{i}", unit="C"), '
             f'get_time(city="city{i}")]<|tool_call_end|>'},
            {"role": "tool", "content": "{\"temperature\": 3}"},
            {"role": "tool", "content": "12:00"},
            {"role": "assistant", "content": f"3 C at 12:00 in city{i}."},
        ],
    }  # fmt: skip


def _consistent(tools: list[dict], messages: list[dict]) -> list[tuple[str, dict]]:
    """Every call of the conversation names a shown tool with shown arguments; returns the calls."""
    shown = {t.get("function", t)["name"]: t.get("function", t) for t in tools}
    calls = []
    for message in messages:
        if message["role"] == "assistant":
            for call in find_tool_calls(message["content"]).calls:
                assert call.name in shown, (call.name, sorted(shown))
                assert set(call.arguments) <= set(shown[call.name]["parameters"]["properties"])
                calls.append((call.name, call.arguments))
    return calls


def test_a_disguised_row_calls_the_tools_it_is_shown_with_the_same_values():
    conversation = Conversation(_row(0)["messages"], TOOLS)
    seen_names = set()
    for seed in range(12):
        shown = disguise_conversation(conversation, random.Random(seed))
        calls = _consistent(shown.tools, shown.messages)
        assert [sorted(args.values()) for _, args in calls] == [["C", "city0"], ["city0"]]  # (values never change)
        assert all(t["type"] == "function" for t in shown.tools)  # (OpenAI form kept)
        seen_names |= {name for name, _ in calls}
        assert conversation.messages[1]["content"].startswith("<|tool_call_start|>[get_weather(")  # (not mutated)
        required = shown.tools[[t["function"]["name"] for t in shown.tools].index(calls[0][0])]["function"]
        assert set(required["parameters"]["required"]) <= set(required["parameters"]["properties"])
    assert len(seen_names) > 4  # (other names on other rows)


def test_a_system_prompt_tool_list_is_disguised_in_place():
    listed = [t["function"] for t in TOOLS]
    for system in (
        "You help. List of tools: <|tool_list_start|>" + json.dumps(listed) + "<|tool_list_end|> Be brief.",
        "You help. List of tools: " + json.dumps(listed, indent=2) + "\nBe brief.",  # (LFM2.5: no markers)
    ):
        messages = [{"role": "system", "content": system}, *_row(1)["messages"]]
        shown = disguise_conversation(Conversation(messages, None), random.Random(3))
        content = shown.messages[0]["content"]
        assert content.startswith("You help. List of tools: ") and "Be brief." in content
        start = content.index("[")
        tools, _ = json.JSONDecoder().raw_decode(content, start)
        _consistent(tools, shown.messages)
    assert disguise_conversation(Conversation(_row(1)["messages"], None), random.Random(0)) is None


def _config(tmp_path, **dataset) -> dict:
    write_jsonl(tmp_path / "train.jsonl", [_row(i) for i in range(24)])
    return tiny_config(
        dataset={"path": str(tmp_path / "train.jsonl"), "test_size": 4, "cache": False, **dataset},
        training_config={"max_length": 512},
    )


def test_training_rows_are_disguised_and_evaluation_rows_keep_the_real_tools(tmp_path):
    out = io.StringIO()
    prepared = validate_config(_config(tmp_path, augment_tools=True), console=Console(file=out, width=200))
    train, held = row_texts(prepared.train.table), row_texts(prepared.eval.table)
    assert len(train) == 20 and len(held) == 4
    for text in held:
        assert "[get_weather(city=" in text and '"name": "get_weather"' in text
    disguised = [t for t in train if "[get_weather(city=" not in t]
    assert len(disguised) >= 18  # (a disguise may draw the real name back by chance: the empty prefix and suffix)
    for text in disguised:
        called = re.search(r"<\|tool_call_start\|>\[(\w+)\(", text).group(1)
        assert f'"name": "{called}"' in text  # the called name is the one the row's tool list shows
    assert "augment_tools: 20 training row(s) are shown their tools disguised" in out.getvalue()
    # half the rows with a share
    out = io.StringIO()
    half = validate_config(_config(tmp_path, augment_tools=0.5), console=Console(file=out, width=200))
    count = int(re.search(r"augment_tools: (\d+) training row", out.getvalue()).group(1))
    plain = sum("[get_weather(city=" in t for t in row_texts(half.train.table))
    assert 0 < count < 20 and plain >= 20 - count


def test_the_mistakes_are_refused_before_training(tmp_path):
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "hello"}]}] * 8)  # fmt: skip
    config = tiny_config(dataset={"path": str(tmp_path / "chat.jsonl"), "augment_tools": True, "cache": False})
    result = invoke("validate", str(write_config(tmp_path, config)))
    assert result.returncode == 2 and "dataset.augment_tools" in result.stderr
    assert "no training row has tool definitions to disguise" in result.stderr and "Traceback" not in result.stderr

    config = _config(tmp_path, augment_tools=True)
    config.update(training_type="dpo")
    config["training_config"]["extends"] = "DEFAULT_DPO"
    result = invoke("validate", str(write_config(tmp_path, config)))
    assert result.returncode == 2 and "dataset.augment_tools" in result.stderr and "remove" in result.stderr
    config.update(training_type="grpo", rewards=["accuracy"])
    config["training_config"] = {"extends": "DEFAULT_GRPO"}
    result = invoke("validate", str(write_config(tmp_path, config)))
    assert result.returncode == 2 and "environment.augment_tools" in result.stderr

    config = _config(tmp_path, augment_tools=1.5)
    result = invoke("validate", str(write_config(tmp_path, config)))
    assert result.returncode == 2 and "(0, 1]" in result.stderr
