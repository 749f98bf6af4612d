"""Generation metrics against hand-computed values; they never raise on odd output."""

from __future__ import annotations

import pytest

from leap_finetune.evaluation.metrics import (
    bleu,
    exact_match,
    load_metric,
    mcq_gen,
    mcq_letter,
    normalise,
    rouge_l,
    short_answer,
)


def test_normalise():
    assert normalise("  The Capital, of France!  ") == "capital of france"


@pytest.mark.parametrize(
    ("prediction", "reference", "score"),
    [
        ("Paris.", "paris", 1.0),
        ("The answer: Paris", "Paris", 0.0),
        ("An apple", "apple", 1.0),
        ("", "x", 0.0),
    ],
)
def test_exact_match(prediction, reference, score):
    assert exact_match(prediction, reference) == (score, True)


@pytest.mark.parametrize(
    ("prediction", "reference", "score"),
    [
        ("I think the answer is Paris, France.", "Paris", 1.0),
        ("Parisian food", "Paris", 0.0),  # whole words only
        ("new york city", "New York", 1.0),
        ("york", "New York", 0.0),
    ],
)
def test_short_answer(prediction, reference, score):
    assert short_answer(prediction, reference)[0] == score


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("B", "B"),
        ("(C)", "C"),
        ("B) Paris", "B"),
        ("The answer is D.", "D"),
        ("answer: (a)", "A"),
        ("I am not sure", None),
        ("", None),
    ],
)
def test_mcq_letter(text, letter):
    assert mcq_letter(text) == letter


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        ("The answer is B.", "B", (1.0, True)),
        ("(C) Rome", "B", (0.0, True)),
        ("no idea at all", "B", (0.0, False)),  # unparseable: 0 and counted
        ("Paris", "Paris", (1.0, True)),  # option text as the reference
    ],
)
def test_mcq_gen(prediction, reference, expected):
    assert mcq_gen(prediction, reference) == expected


def test_rouge_l_hand_computed():
    # normalised: pred [cat, sat, on, mat], ref [cat, is, on, mat]; LCS = 3 -> P = R = F = 0.75
    assert rouge_l("The cat sat on the mat", "the cat is on the mat")[0] == pytest.approx(0.75)
    assert rouge_l("a b c", "a b c")[0] == 1.0
    assert rouge_l("x y", "a b")[0] == 0.0
    assert rouge_l("", "a b") == (0.0, False)


def test_bleu_extremes_and_a_hand_computed_case():
    assert bleu("the cat sat on the mat", "the cat sat on the mat")[0] == pytest.approx(100.0)
    assert bleu("xyz", "the cat sat on the mat")[0] == pytest.approx(0.0, abs=1e-6)
    # 6-token candidate vs 7-token reference, all 1..4-grams match: BLEU = brevity penalty exp(1 - 7/6)
    import math

    assert bleu("the cat sat on the mat", "the cat sat on the mat today")[0] == pytest.approx(
        100 * math.exp(1 - 7 / 6), rel=1e-3
    )


def test_custom_metric_from_a_file_and_its_failures_score_zero(tmp_path):
    (tmp_path / "m.py").write_text(
        "def length_ok(prediction, reference, row):\n"
        "    if prediction == 'boom':\n        raise ValueError('odd output')\n"
        "    return float(len(prediction) == len(reference))\n"
    )
    metric = load_metric(f"{tmp_path / 'm.py'}::length_ok")
    assert metric("abc", "xyz") == (1.0, True)
    assert metric("boom", "xyz") == (0.0, False)
