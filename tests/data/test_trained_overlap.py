"""Rows measured that were also trained on, found by what is trained on (not the rows as written): evaluation rows
that are copies of training rows with a column of their own, and benchmark rows whose prompt and reference turn are
training conversations - every row compared, each by a digest - are counted in a `note:` of `validate`."""

from __future__ import annotations

from tests.conftest import chat, invoke, tiny_config, write_config, write_jsonl


def _rows(prefix: str, n: int) -> list[dict]:
    return [chat(f"{prefix} question {i}", f"{prefix} answer {i}") for i in range(n)]


def _said(workdir, config: dict, name: str = "config.yaml") -> str:
    result = invoke("validate", str(write_config(workdir, config, name)), cwd=workdir)
    assert result.returncode == 0, result.stderr
    return " ".join(result.stderr.split())


def test_evaluation_rows_that_copy_training_rows_with_a_column_of_their_own_are_counted(workdir):
    """Was compared as written: each row plus "id": i was another row, and nothing was said."""
    rows = _rows("row", 12)
    write_jsonl(workdir / "train.jsonl", rows)
    write_jsonl(workdir / "held.jsonl", [{**row, "id": i} for i, row in enumerate(rows[:3])] + _rows("held", 2))
    said = _said(workdir, tiny_config(dataset={"path": "train.jsonl", "val_path": "held.jsonl"}))
    assert "note: 3 of the 5 evaluation row(s) are also training rows (the same row in both splits" in said, said
    # the same conversations with other words are other rows: nothing said
    write_jsonl(workdir / "other.jsonl", [{**chat(f"row question {i}", "another answer"), "id": i} for i in range(3)])
    said = _said(workdir, tiny_config(dataset={"path": "train.jsonl", "val_path": "other.jsonl"}), "other.yaml")
    assert "also training rows" not in said


def test_benchmark_rows_that_are_training_rows_are_counted_with_an_example(workdir):
    rows = _rows("row", 12)
    long = {"messages": chat("first", "one")["messages"] + chat("second", "two")["messages"]}
    write_jsonl(workdir / "train.jsonl", rows + [long])
    bench = [
        {**rows[4], "id": "a"},  # a training row with a column of its own
        _rows("new", 1)[0],
        rows[7],
        {"messages": long["messages"][:2]},  # the beginning of a training conversation, up to an assistant turn
        _rows("new", 3)[2],
    ]
    write_jsonl(workdir / "bench.jsonl", bench)
    evals = {"benchmarks": [{"name": "b", "path": "bench.jsonl", "metric": "exact_match"}]}
    said = _said(workdir, tiny_config(dataset={"path": "train.jsonl"}, evals=evals))
    expected = (
        "note: 3 of the 5 row(s) of benchmark 'b' are also training rows (their prompt and reference turn are a "
        f"training conversation), e.g. {workdir / 'bench.jsonl'}, line 1: the benchmark measures memorisation"
    )
    assert expected in said, said
    # the second time the training rows come from the data cache: the same note
    again = _said(workdir, tiny_config(dataset={"path": "train.jsonl"}, evals=evals))
    assert "prepared rows read from the cache" in again and expected in again, again
    # dataset.path is the benchmark file itself: each of its rows is trained on
    said = _said(workdir, tiny_config(dataset={"path": "bench.jsonl"}, evals=evals), "self.yaml")
    assert "5 of the 5 row(s) of benchmark 'b' are also training rows" in said, said
    # a benchmark of other rows: nothing said
    write_jsonl(workdir / "clean.jsonl", _rows("clean", 4))
    clean = {"benchmarks": [{"name": "c", "path": "clean.jsonl", "metric": "exact_match"}]}
    assert "benchmark 'c'" not in _said(workdir, tiny_config(dataset={"path": "train.jsonl"}, evals=clean), "c.yaml")


def test_a_benchmark_that_reads_the_training_file_is_said_where_no_row_matches(workdir):
    """Multiple-choice rows trained on with loss_on: all: no training conversation ends with the right option, and
    the benchmark still scores rows the model was trained on."""
    question = {"role": "user", "content": "Which colour is the sky?"}
    write_jsonl(workdir / "mcq.jsonl", [{"messages": [question], "options": ["blue", "red"], "answer_id": 0}] * 8)
    evals = {"benchmarks": [{"name": "m", "path": "mcq.jsonl", "metric": "logprob_mcq"}]}
    config = tiny_config(dataset={"path": "mcq.jsonl"}, evals=evals, training_config={"loss_on": "all"})
    said = _said(workdir, config)
    assert f"note: benchmark 'm' reads {workdir / 'mcq.jsonl'}, which dataset.path trains on" in said, said
