"""The retrieval row contract: every problem named with file, row and field, read through the real readers
(JSONL, CSV)."""

from __future__ import annotations

import csv
import json

import pytest

from leap_finetune.data.readers import read_dataset
from leap_finetune.data.retrieval_rows import RetrievalRow, check_retrieval_row


def _check(tmp_path, rows: list, suffix: str = "jsonl"):
    path = tmp_path / f"rows.{suffix}"
    if suffix == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=sorted({k for r in rows for k in r}))
            writer.writeheader()
            writer.writerows(rows)
    result = read_dataset(str(path), split=None, subset=None, limit=None, key="dataset.path")
    return [check_retrieval_row(row) for row in result.rows]


def test_valid_rows_with_one_several_and_no_negatives(tmp_path):
    checked = _check(
        tmp_path,
        [
            {"query": "capital of France?", "positive": "Paris is the capital of France."},
            {"query": "q", "positive": "p", "negative": "n"},
            {"query": "q", "positive": "p", "negative": ["n1", "n2"], "id": 7},
        ],
    )
    assert [c[0] for c in checked] == [
        RetrievalRow("capital of France?", "Paris is the capital of France."),
        RetrievalRow("q", "p", ["n"]),
        RetrievalRow("q", "p", ["n1", "n2"]),
    ]
    assert all(not c[1] for c in checked)


@pytest.mark.parametrize(
    ("row", "field", "text"),
    [
        ({"positive": "p"}, "query", "missing; a retrieval row needs `query` and `positive`"),
        ({"anchor": "q", "positive": "p"}, "query", "the row has `anchor`: rename it to `query`"),
        ({"query": "q"}, "positive", "missing"),
        ({"query": "  ", "positive": "p"}, "query", "is empty"),
        ({"query": 3, "positive": "p"}, "query", "expected a string, got a number (3)"),
        ({"query": "q", "positive": ["p"]}, "positive", "expected a string, got a list"),
        ({"query": "q", "positive": "p", "negative": "p"}, "negative", "equals the positive"),
        ({"query": "q", "positive": "p", "negative": ["n", " p "]}, "negative[1]", "equals the positive"),
        ({"query": "q", "positive": "p", "negative": ["n", 5]}, "negative[1]", "expected a string, got a number (5)"),
        ({"query": "q", "positive": "p", "negative": ""}, "negative", "is empty"),
        (
            {"query": "q", "positive": "p", "negative": {"text": "n"}},
            "negative",
            "expected a string or a list of strings",
        ),
        ({"query": "q", "positive": "p", "negatives": ["n"]}, "negatives", "rename `negatives` to `negative`"),
        (["q", "p"], "<row>", "expected an object with `query`, `positive`"),
    ],
)
def test_each_problem_names_the_row_and_field(tmp_path, row, field, text):
    [(parsed, problems, _)] = _check(tmp_path, [row])
    assert parsed is None
    assert any(p.field == field and text in p.problem for p in problems), problems
    assert all(p.location == "line 1" and p.file.endswith("rows.jsonl") for p in problems)


def test_csv_negatives_arrive_as_json_text(tmp_path):
    checked = _check(
        tmp_path,
        [
            {"query": "q", "positive": "p", "negative": json.dumps(["n1", "n2"])},
            {"query": "q", "positive": "p", "negative": "[not json"},
            {"query": "q", "positive": "p", "negative": json.dumps(["p"])},
        ],
        suffix="csv",
    )
    assert checked[0][0].negatives == ["n1", "n2"] and checked[1][0].negatives == ["[not json"]
    assert (
        checked[2][0] is None
        and checked[2][1][0].field == "negative[0]"
        and checked[2][1][0].location.startswith("row 3")
    )
