"""Tool-calling SFT end to end on tiny-lfm2 and tiny-lfm2.5: what is rendered (byte-identical to
the official templates after normalisation), what is trained (the calls and answers, not the tool
results or definitions), and a real training run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leap_finetune.api import run_config
from leap_finetune.data.chat_templates import official_template
from leap_finetune.models.tiny import load_tiny_tokenizer
from tests.conftest import invoke, tiny_config, write_config, write_jsonl

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
LFM2_LIST = 'List of tools: <|tool_list_start|>[{"name": "get_weather"}]<|tool_list_end|>'
CALL = '<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>'

ROWS = [
    # bracket notation; tool list in the system prompt (LFM2 style); pre-baked response markers
    {
        "messages": [
            {"role": "system", "content": LFM2_LIST},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": CALL},
            {"role": "tool", "content": '<|tool_response_start|>{"temp": -3}<|tool_response_end|>'},
            {"role": "assistant", "content": "It is -3 C in Oslo."},
            {"role": "user", "content": "Thanks"},
            {"role": "assistant", "content": "Anytime."},
        ]
    },
    # OpenAI-style structured calls (two of them, JSON-string arguments) and a `tools` column
    {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Oslo and Lima?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lima", "days": 2}}},
                ],
            },
            {"role": "tool", "content": '{"temp": -3}'},
            {"role": "tool", "content": '{"temp": 19}'},
            {"role": "assistant", "content": "Oslo -3 C, Lima 19 C."},
        ],
    },
]
TWO_CALLS = '<|tool_call_start|>[get_weather(city="Oslo"), get_weather(city="Lima", days=2)]<|tool_call_end|>'


def expected(family: str) -> list[tuple[dict, list | None]]:
    """The rows after normalisation: what the official template must render."""
    system = (
        LFM2_LIST if family == "lfm2" else LFM2_LIST.replace("<|tool_list_start|>", "").replace("<|tool_list_end|>", "")
    )
    first = [dict(m) for m in ROWS[0]["messages"]]
    first[0]["content"] = system
    first[3]["content"] = '{"temp": -3}'
    second = [
        {"role": "user", "content": "Oslo and Lima?"},
        {"role": "assistant", "content": TWO_CALLS},
        {"role": "tool", "content": '{"temp": -3}'},
        {"role": "tool", "content": '{"temp": 19}'},
        {"role": "assistant", "content": "Oslo -3 C, Lima 19 C."},
    ]
    return [(first, None), (second, TOOLS)]


TRAINED = [
    [CALL + "<|im_end|>", "It is -3 C in Oslo.<|im_end|>", "Anytime.<|im_end|>"],
    [TWO_CALLS + "<|im_end|>", "Oslo -3 C, Lima 19 C.<|im_end|>"],
]


@pytest.mark.parametrize(("model", "family"), [("tiny-lfm2", "lfm2"), ("tiny-lfm2.5", "lfm2.5")])
def test_inspect_shows_official_rendering_and_exact_trained_spans(workdir, model, family):
    write_jsonl(workdir / "train.jsonl", ROWS)
    config = tiny_config(model_name=model, training_config={"max_length": 1024})
    result = invoke("inspect", str(write_config(workdir, config)), "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    items = json.loads(result.stdout)
    tokenizer = load_tiny_tokenizer(model)
    tokenizer.chat_template = official_template(family)
    for item, (messages, tools), trained in zip(items, expected(family), TRAINED, strict=True):
        assert item["text"] == tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        assert [item["text"][a:b] for a, b in item["trained_spans"]] == trained
    # tool definitions and results are in the text but never trained
    definitions = "<|tool_list_start|>" if family == "lfm2" else "List of tools: ["
    assert definitions in items[1]["text"]
    for item in items:
        for start, end in item["trained_spans"]:
            assert "List of tools" not in item["text"][start:end] and '"temp"' not in item["text"][start:end]
    # the tool-call markers are single special tokens
    ids = tokenizer(items[0]["text"], add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|tool_call_start|>")) == 1
    assert ids.count(tokenizer.convert_tokens_to_ids("<|tool_call_end|>")) == 1


def test_validate_reports_each_normalisation_once_with_a_count(workdir):
    write_jsonl(workdir / "train.jsonl", ROWS * 3)
    result = invoke("validate", str(write_config(workdir, tiny_config(model_name="tiny-lfm2.5"))), cwd=workdir)
    assert result.returncode == 0, result.stderr
    err = " ".join(result.stderr.split())
    assert "stripped <|tool_response_start|>/<|tool_response_end|>" in err and "3 row(s)" in err
    assert (
        "stripped <|tool_list_start|>/<|tool_list_end|> from the system prompt: LFM2.5 does not use them: 3 row(s)"
        in err
    )
    assert "converted structured `tool_calls` to LFM bracket notation" in err


@pytest.mark.parametrize("model", ["tiny-lfm2", "tiny-lfm2.5"])
def test_tool_calling_sft_run_learns(workdir, model):
    write_jsonl(workdir / "train.jsonl", ROWS * 8)
    summary = run_config(
        write_config(
            workdir,
            tiny_config(model_name=model, training_config={"max_steps": 12, "max_length": 1024, "learning_rate": 3e-3}),
        )
    )
    metrics = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in metrics if "loss" in m]
    assert losses[-1] < losses[0] / 2
    assert (Path(summary["run_dir"]) / "model" / "model.safetensors").exists()
