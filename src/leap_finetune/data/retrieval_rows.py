"""The retrieval row contract (training_type embedding and colbert): a `query`, the `positive` text that
answers it, and optionally `negative` - one hard negative (a string) or several (a list of strings).

Every row is checked before a model loads: missing or empty fields, values that are not strings, and a
negative equal to the positive (the loss would push the query away from its own answer). The column
names of sentence-transformers' own datasets (`anchor`) get a rename hint. Other columns are ignored.
In CSV files a list of negatives arrives as JSON text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from leap_finetune.data.messages import describe_value
from leap_finetune.data.readers import SourceRow
from leap_finetune.data.sft_rows import RowWarning
from leap_finetune.errors import RowProblem

# other names of the same columns in public retrieval datasets -> ours
ALIASES = {
    "anchor": "query",
    "question": "query",
    "pos": "positive",
    "document": "positive",
    "neg": "negative",
    "negatives": "negative",
}


@dataclass
class RetrievalRow:
    query: str
    positive: str
    negatives: list[str] = field(default_factory=list)


def check_retrieval_row(row: SourceRow, **_) -> tuple[RetrievalRow | None, list[RowProblem], list[RowWarning]]:
    problems: list[RowProblem] = []

    def problem(name: str, text: str) -> None:
        problems.append(RowProblem(row.file, row.location, name, text))

    data = row.data
    if not isinstance(data, dict):
        problem(
            "<row>",
            f"expected an object with `query`, `positive` (and optionally `negative`), got {describe_value(data)}",
        )
        return None, problems, []
    texts = {}
    for name in ("query", "positive"):
        value = data.get(name)
        if name not in data:
            alias = next((a for a, ours in ALIASES.items() if ours == name and a in data), None)
            problem(
                name,
                f"missing (the row has `{alias}`: rename it to `{name}`)"
                if alias
                else f"missing; a retrieval row needs `query` and `positive` (found: {', '.join(sorted(data)) or 'nothing'})",
            )
        elif not isinstance(value, str):
            problem(name, f"expected a string, got {describe_value(value)}")
        elif not value.strip():
            problem(name, "is empty")
        else:
            texts[name] = value
    negatives, listed = _negatives(data, row.from_text_table, problem)
    positive = texts.get("positive")
    for index, negative in enumerate(negatives):
        where = f"negative[{index}]" if listed else "negative"
        if positive is not None and negative.strip() == positive.strip():
            problem(where, "equals the positive: the loss would push the query away from its own answer")
    if problems:
        return None, problems, []
    return RetrievalRow(texts["query"], texts["positive"], negatives), [], []


def _negatives(data: dict, from_text_table: bool, problem) -> tuple[list[str], bool]:
    """(the negatives, whether the row gave a list); problems reported through `problem`."""
    if "negative" not in data:
        if "negatives" in data:
            problem("negatives", "rename `negatives` to `negative` (a string, or a list of strings)")
        return [], False
    value: Any = data["negative"]
    if value is None:
        return [], False
    if from_text_table and isinstance(value, str) and value.lstrip().startswith("["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass  # a negative text that starts with "["
    if isinstance(value, str):
        if not value.strip():
            problem("negative", "is empty (leave the field out, or null, for no hard negative)")
            return [], False
        return [value], False
    if not isinstance(value, list):
        problem("negative", f"expected a string or a list of strings, got {describe_value(value)}")
        return [], False
    negatives = []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            problem(f"negative[{index}]", f"expected a string, got {describe_value(item)}")
        elif not item.strip():
            problem(f"negative[{index}]", "is empty")
        else:
            negatives.append(item)
    return negatives, True
