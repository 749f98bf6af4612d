"""Chat rendering is byte-identical to the official templates; loss masks cover exactly the
assistant's content and its <|im_end|>."""

from __future__ import annotations

import pytest

from leap_finetune.api import validate_config
from leap_finetune.data.chat_templates import load_chat_template, official_template
from leap_finetune.data.render import IGNORE_INDEX, Renderer
from leap_finetune.models.tiny import load_tiny_tokenizer
from tests.conftest import chat, tiny_config, write_jsonl

CONVERSATIONS = {
    "single turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
    "system + multi-turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Japan? Ünïcödé ✓"},
        {"role": "assistant", "content": "Tokyo.\nDone."},
    ],
    "tool turn": [
        {"role": "system", "content": 'List of tools: <|tool_list_start|>[{"name": "get_weather"}]<|tool_list_end|>'},
        {"role": "user", "content": "Weather in Boston?"},
        {"role": "assistant", "content": '<|tool_call_start|>[get_weather(location="Boston")]<|tool_call_end|>'},
        {"role": "tool", "content": '{"temperature": 72}'},
        {"role": "assistant", "content": "It's 72 F."},
    ],
    "structured tool call": [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}
            ],
        },
        {"role": "tool", "content": "cold"},
        {"role": "assistant", "content": "Cold."},
    ],
}
TEMPLATES = [("tiny-lfm2", "lfm2"), ("tiny-lfm2", "lfm2-v1"), ("tiny-lfm2.5", "lfm2.5")]


def _renderer(model: str, template: str, loss_on: str = "assistant", max_length=None) -> Renderer:
    tokenizer = load_tiny_tokenizer(model)
    return Renderer(tokenizer, load_chat_template(template, tokenizer), loss_on, max_length)


# The first LFM2 template ignores structured `tool_calls` (TRL's notes on lfm2.jinja), so that one
# pairing is not a fidelity claim.
FIDELITY_CASES = [
    (model, template, name)
    for model, template in TEMPLATES
    for name in CONVERSATIONS
    if not (template == "lfm2-v1" and name == "structured tool call")
]


@pytest.mark.parametrize(("model", "template", "name"), FIDELITY_CASES)
def test_rendering_is_byte_identical_to_the_official_template(model, template, name):
    messages = CONVERSATIONS[name]
    renderer = _renderer(model, template)
    tokenizer = load_tiny_tokenizer(model)
    tokenizer.chat_template = official_template(template)
    expected = tokenizer.apply_chat_template(messages, tokenize=False)
    text, _ = renderer.render(messages)
    assert text == expected
    assert text.startswith("<|startoftext|><|im_start|>")


@pytest.mark.parametrize(("model", "template"), TEMPLATES)
def test_loss_covers_each_assistant_content_and_its_im_end(model, template):
    messages = CONVERSATIONS["system + multi-turn"]
    row = _renderer(model, template).tokenize(messages)
    assert [row.text[a:b] for a, b in row.trained_spans] == ["Paris.<|im_end|>", "Tokyo.\nDone.<|im_end|>"]
    tokenizer = load_tiny_tokenizer(model)
    trained_ids = [t for t in row.labels if t != IGNORE_INDEX]
    assert tokenizer.decode(trained_ids) == "Paris.<|im_end|>Tokyo.\nDone.<|im_end|>"
    # the role header and the user's words never carry loss
    assert all(
        label == IGNORE_INDEX
        for label, token in zip(row.labels, row.input_ids)
        if token == tokenizer.convert_tokens_to_ids("<|im_start|>")
    )


def test_tool_call_is_trained_and_tool_response_is_not():
    row = _renderer("tiny-lfm2", "lfm2").tokenize(CONVERSATIONS["tool turn"])
    trained = [row.text[a:b] for a, b in row.trained_spans]
    assert trained == [
        '<|tool_call_start|>[get_weather(location="Boston")]<|tool_call_end|><|im_end|>',
        "It's 72 F.<|im_end|>",
    ]
    assert '<|tool_response_start|>{"temperature": 72}<|tool_response_end|>' in row.text


def test_final_assistant_only():
    row = _renderer("tiny-lfm2", "lfm2", loss_on="final_assistant").tokenize(CONVERSATIONS["system + multi-turn"])
    assert [row.text[a:b] for a, b in row.trained_spans] == ["Tokyo.\nDone.<|im_end|>"]


def test_all_tokens():
    row = _renderer("tiny-lfm2", "lfm2", loss_on="all").tokenize(CONVERSATIONS["single turn"])
    assert row.trained_spans == [(0, len(row.text))]
    assert row.labels == row.input_ids


def test_template_without_generation_markers_needs_loss_on_all(tmp_path):
    from leap_finetune.errors import LeapError

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    path = tmp_path / "plain.jinja"
    path.write_text("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    template = load_chat_template(str(path), tokenizer)
    with pytest.raises(LeapError, match="no \\{% generation %\\} markers"):
        Renderer(tokenizer, template, "assistant", None)
    assert (
        Renderer(tokenizer, template, "all", None).tokenize(CONVERSATIONS["single turn"]).text
        == "user: Hi\nassistant: Hello!\n"
    )


def test_rows_cut_off_by_max_length_are_reported_not_trained(tmp_path):
    long_prompt = "word " * 200
    rows = [chat("short", "fine")] * 3 + [chat(long_prompt, "lost answer"), chat("medium " * 5, "a long answer " * 20)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    prepared = validate_config(tiny_config(data=str(tmp_path / "train.jsonl"), training_config={"max_length": 48}))
    assert len(prepared.train) == 4
    assert prepared.fully_truncated == 1
    assert prepared.partially_truncated == 1
    dropped = [d for d in prepared.dropped if "max_length" in d.reason]
    assert dropped[0].location == "line 4"
    assert all(len(ids) <= 48 for ids in prepared.train.column("input_ids"))
    cut = prepared.train.examples[3]
    assert cut["truncated_at"] is not None and all(end <= cut["truncated_at"] for _, end in cut["trained_spans"])


def test_loss_masks_in_numpy_equal_the_per_token_definition():
    """A token carries loss when it is not empty and overlaps a trained character span; trained tokens that touch
    or overlap are reported as one span. Checked against that definition, written out per token, on random
    offsets (empty tokens, tokens that step back a character) and spans (unsorted, touching)."""
    import random

    import numpy as np

    from leap_finetune.data.render import _merge, _overlaps

    def per_token(offsets, spans):
        return [end > start and any(start < b and end > a for a, b in spans) for start, end in offsets]

    def joined(offsets):
        merged = []
        for start, end in offsets:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return [tuple(m) for m in merged]

    rng = random.Random(1)
    for _ in range(2000):
        position, offsets = 0, []
        for _ in range(rng.randint(0, 40)):
            width = rng.choice([0, 1, 2, 3])
            position = max(0, position - 1) if rng.random() < 0.1 else position
            offsets.append((position, position + width))
            position += width
        spans, cursor = [], 0
        for _ in range(rng.randint(0, 4)):
            start = rng.randint(cursor, cursor + 10)
            spans.append((start, rng.randint(start, start + 10)))
            cursor = spans[-1][1] + rng.randint(0, 3)
        rng.shuffle(spans)
        array = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
        expected = per_token(offsets, spans)
        assert _overlaps(array, spans).tolist() == expected
        assert _merge(array[np.asarray(expected, dtype=bool)]) == joined([o for o, on in zip(offsets, expected) if on])
