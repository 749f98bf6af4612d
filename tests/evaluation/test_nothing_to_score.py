"""A benchmark row whose reference answer is nothing once its metric normalises it ("...", "The", "A" under
exact_match) is refused at validate, naming the file, line and reference: under exact_match an empty answer matched
it and scored 1.0 (was seen with `eval --server` against a server answering ""). The scorers give no credit for it
either."""

from __future__ import annotations

import pytest

from leap_finetune.evaluation.metrics import BUILTIN
from tests.conftest import chat, invoke, write_config, write_jsonl

# (metric, references with nothing left, a reference of the same kind that is kept)
CASES = [
    ("exact_match", ["...", "The", "A"], "Paris"),
    ("short_answer", ["An.", "!?"], "Paris"),
    ("rouge_l", ["the a an", "---"], "the red car"),
    ("mcq_gen", ["...", "The."], "B"),
    ("bleu", ["<think>it is Paris</think>"], "Paris"),
]


def _validate(workdir, metric: str, references: list[str]):
    write_jsonl(workdir / "train.jsonl", [chat("Say red.", "red")] * 4)
    write_jsonl(workdir / "bench.jsonl", [chat(f"Question {i}?", ref) for i, ref in enumerate(references)])
    config = {
        "model_name": "tiny-lfm2",
        "training_type": "sft",
        "dataset": {"path": "train.jsonl"},
        "evals": {"benchmarks": [{"name": "qa", "path": "bench.jsonl", "metric": metric}]},
    }
    return invoke("validate", str(write_config(workdir, config)), cwd=workdir)


@pytest.mark.parametrize(("metric", "empty", "kept"), CASES, ids=[c[0] for c in CASES])
def test_a_reference_with_nothing_left_under_its_metric_is_refused_naming_the_row(workdir, metric, empty, kept):
    result = _validate(workdir, metric, [kept, *empty])
    text = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{len(empty)} problem(s) in {len(empty)} of {len(empty) + 1} benchmark 'qa' row(s)" in text, text
    for line, reference in enumerate(empty, start=2):
        assert f"bench.jsonl, line {line}, field 'messages[1].content': the reference answer {reference!r}" in text
    assert "line 1," not in text  # (the row with an answer is kept)
    assert f"is nothing once metric {metric} normalises it" in text and "remove the row" in text
    if metric == "exact_match":
        assert "an empty answer would score 1.0 on it" in text and "use metric mcq_gen" in text
    else:
        assert "every answer would score 0" in text
    assert _validate(workdir, metric, [kept]).returncode == 0


def test_no_metric_gives_credit_for_an_answer_against_a_reference_with_nothing_left():
    """Empty against empty, once normalised, is no match (exact_match gave 1.0 for "" against "..."); BLEU keeps
    punctuation, so only its empty answer is asked."""
    references = ["...", "The", "A", "", "<think>x</think>"]
    for metric in ("exact_match", "short_answer", "rouge_l", "mcq_gen", "bleu"):
        for answer in [""] if metric == "bleu" else ["", "the", "...", "An!"]:
            for reference in references:
                if metric == "mcq_gen" and reference == "A":
                    continue  # (an option letter: something to match)
                assert BUILTIN[metric](answer, reference)[0] == 0.0, (metric, reference, answer)


def test_references_that_name_something_still_score():
    assert BUILTIN["exact_match"]("Paris.", "paris") == (1.0, True)
    assert BUILTIN["mcq_gen"]("(B)", "b") == (1.0, True)
    assert BUILTIN["mcq_gen"]("It is 1", "1") == (1.0, True)  # (a one-digit option text, not a letter)
