"""The tokenizer's `response_template` for LFM models: how `transformers serve` (and `tokenizer.parse_response`) reads
a generated assistant turn into content, reasoning and OpenAI `tool_calls`.

transformers 5 parses a response with a declarative template saved in tokenizer_config.json; it ships templates for
Qwen and Gemma only, and without one `transformers serve` returns LFM's tool calls as plain text (their markers are
special tokens, removed from the decoded content). LFM bracket notation is what transformers' own
`python-call-list` parser reads, so the template below is all it takes; every model leap-finetune saves from an LFM
tokenizer carries it (a template the tokenizer already has is kept). vLLM has its own parser for the same notation:
`--enable-auto-tool-choice --tool-call-parser lfm2` (docs/tool-calling.md).
"""

from __future__ import annotations

LFM_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"\s*<\|tool_call_start\|>",
            "close": "<|tool_call_end|>",
            "content": "python-call-list",
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{arguments}"}},
            "transform_each": True,
        },
        # repeats + join: text before and after a call are one content (one region would keep only the last piece)
        "content": {
            "close_pattern": r"\s*<\|im_end\|>",
            "content": "text",
            "content_args": {"strip": False},
            "repeats": True,
            "join": "",
        },
    },
}
NEEDED_TOKENS = ("<|im_start|>", "<|im_end|>", "<|tool_call_start|>", "<|tool_call_end|>")


def add_response_template(tokenizer) -> None:
    """Give an LFM tokenizer (ChatML turns and LFM's tool-call tokens) the template, unless it has one."""
    if getattr(tokenizer, "response_template", None) is not None or not hasattr(tokenizer, "parse_response"):
        return
    vocabulary = tokenizer.get_vocab()
    if all(token in vocabulary for token in NEEDED_TOKENS):
        tokenizer.response_template = LFM_RESPONSE_TEMPLATE
