"""What a row trains on, as 64-bit digests (the same in every worker process: Python's own hash of text differs per
process): evaluation rows and benchmark rows that are also training rows are found by comparing them, every row at
the cost of one hash (data/prepare.py, evaluation/trained_rows.py).

A row is compared by what is trained on - its fields as the data step parsed them (the messages normalised, the
tools, the images) - not by the row as written: a copy of a training row with a column of its own (`id`) is the
same row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

# passed-through columns of a row (GRPO's `extra`: read by the reward functions, never shown to the model)
PASSED_THROUGH = ("extra",)


def digest(value) -> int:
    """64 bits of a JSON value (key order aside)."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def trained_digest(parsed) -> int:
    """The row's trained fields as the data step parsed them (a checker's dataclass), its passed-through columns
    left out."""
    if dataclasses.is_dataclass(parsed) and not isinstance(parsed, type):
        fields = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(parsed) if f.name not in PASSED_THROUGH}
        return digest({name: _plain(value) for name, value in fields.items()})
    return digest(parsed)


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def turn_digests(messages: list[dict]) -> list[int]:
    """A digest of each beginning of the conversation that ends with an assistant turn, by each turn's role and text
    (a benchmark row - its prompt and reference turn - that is such a beginning was trained on)."""
    running = hashlib.blake2b(digest_size=8)
    found = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role, text = message.get("role"), _text(message.get("content"))
        running.update(f"{role}:{len(text)}:{text}".encode())  # (the length: no two turn lists give the same bytes)
        if role == "assistant":
            found.append(int.from_bytes(running.copy().digest(), "little"))
    return found


def conversation_digest(messages: list[dict]) -> int | None:
    """The digest of the whole conversation, ending with its (assistant) reference turn: what turn_digests gives for
    the training conversation it begins."""
    found = turn_digests(messages)
    return found[-1] if found and messages and messages[-1].get("role") == "assistant" else None


def _text(content) -> str:
    if content is None:
        return ""
    return content.strip() if isinstance(content, str) else json.dumps(content, sort_keys=True, default=str)
