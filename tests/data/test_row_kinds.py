"""data/row_kinds.py: each kind of row methods/ names has one entry, found by the kind (never by the type's name), and
rows of another type's kind are recognised by their columns."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from leap_finetune import methods
from leap_finetune.data.row_kinds import ROW_KINDS, other_types_for, row_kind_of, tokens_line


def test_every_kind_a_type_reads_has_an_entry_and_every_entry_a_type():
    assert {m.rows for m in methods.METHODS.values()} == set(ROW_KINDS)
    for kind in ROW_KINDS.values():
        assert kind.marks and all(kind.marks), kind.kind


def test_rows_of_another_type_are_named_with_every_type_that_reads_them():
    pairs = [{"prompt", "chosen", "rejected"}] * 3
    assert other_types_for(pairs, "sft") == ["dpo"]
    assert other_types_for(pairs, "dpo") == []
    # (a KTO row has a prompt too, and a GRPO row's prompt is no DPO pair: the columns each kind needs decide)
    assert other_types_for([{"prompt", "completion", "label"}], "grpo") == ["kto"]
    assert other_types_for([{"prompt", "solution"}], "kto") == ["grpo"]
    assert other_types_for([{"query", "positive"}], "sft") == ["embedding", "colbert"]
    assert other_types_for([{"conversations"}], "embedding") == ["sft", "distill"]
    # (the shapes naming more columns are asked first: a `messages` column beside a pair's columns is still a pair)
    assert other_types_for([{"messages", "chosen", "rejected"}], "sft") == ["dpo"]
    assert other_types_for([{"messages"}, {"text"}], "dpo") == []  # (not every row has them)
    assert other_types_for([], "dpo") == []


def test_a_type_added_at_run_time_gets_everything_from_its_row_kind(monkeypatch):
    """A copy of SFT under another name: no entry of its own, its rows are conversations in every question."""
    toy = dataclasses.replace(methods.METHODS["sft"], name="toy_sft")
    monkeypatch.setitem(methods.METHODS, "toy_sft", toy)
    assert row_kind_of("toy_sft") is row_kind_of("sft") is ROW_KINDS[methods.CONVERSATION]
    assert row_kind_of(SimpleNamespace(training_type="toy_sft")).spills
    assert other_types_for([{"messages"}], "dpo") == ["sft", "distill", "toy_sft"]
    assert other_types_for([{"messages"}], "toy_sft") == []


@pytest.mark.parametrize(
    ("training_type", "first_line"),
    [
        ("sft", "data: 4 rows read -> 3 train, 1 eval; 30 train tokens, 12 carry loss"),
        ("dpo", "data: 4 rows read -> 3 train, 1 eval; 30 train tokens, 12 carry loss"),
        ("grpo", "data: 4 rows read -> 3 train prompts (2 with a solution), 1 eval; 30 prompt tokens"),
        ("embedding", "data: 4 rows read -> 3 train, 1 eval (query, positive, negatives); 30 train tokens"),
    ],
)
def test_the_data_reports_first_line_is_the_row_kinds(training_type, first_line):
    prepared = SimpleNamespace(
        rows_read=4, train=_Split(3, ["a", "", "b"]), eval=_Split(1, []), train_tokens=30, trained_tokens=12
    )
    assert row_kind_of(training_type).data_line(prepared) == first_line
    assert tokens_line(prepared) == ROW_KINDS[methods.CONVERSATION].data_line(prepared)


def test_kto_rows_out_of_balance_are_warned_and_pairs_report_their_rewards():
    resolved = SimpleNamespace(training={})
    prepared = SimpleNamespace(train=_Split(4, [True, True, True, True]))
    assert row_kind_of("kto").data_warnings(prepared, resolved) == [
        "KTO data has no undesirable (label false) rows: KTO learns from both kinds; add some"
    ]
    assert row_kind_of("sft").data_warnings(prepared, resolved) == []
    after, before = {"eval_rewards/accuracies": 0.9}, {"eval_rewards/accuracies": 0.5}
    assert row_kind_of("dpo").results(after, before, {"rewards/margins": 1.25}) == [
        ("reward accuracies (held out)", "0.500 -> 0.900"),
        ("reward margins (last training log)", "1.250"),
    ]
    assert row_kind_of("grpo").results(after, before, {}) == []


class _Split:
    def __init__(self, rows: int, column: list):
        self.rows, self.values = rows, column

    def __len__(self) -> int:
        return self.rows

    def column(self, name: str) -> list:
        return self.values
