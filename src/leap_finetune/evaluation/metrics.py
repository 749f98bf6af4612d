"""Generation metrics. Each returns (score in [0, 1] (BLEU: 0-100), parsed): a metric never raises
on odd model output; output it cannot read scores 0 and is counted as unparsed."""

from __future__ import annotations

import re
import string
from collections.abc import Callable

from leap_finetune.errors import LeapError

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalise(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (the SQuAD normalisation)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, reference: str, item=None) -> tuple[float, bool]:
    """The normalised texts are equal. A reference with nothing left once normalised ("...", "The") scores 0: an
    empty answer is not a right one (validate refuses such rows: `scored_reference`)."""
    ref = normalise(reference)
    if not ref:
        return 0.0, False
    return float(normalise(prediction) == ref), True


def short_answer(prediction: str, reference: str, item=None) -> tuple[float, bool]:
    """The normalised reference appears in the normalised answer as whole words."""
    ref, pred = normalise(reference), normalise(prediction)
    if not ref:
        return 0.0, False
    return float(re.search(rf"(^| ){re.escape(ref)}( |$)", pred) is not None), True


_LETTER_PATTERNS = [
    re.compile(r"answer\s*(?:is|:)?\s*\(?([A-Z])\)?(?![A-Za-z])", re.I),
    re.compile(r"^\s*\(?([A-Z])(?:[\).:]|\s*$)"),  # "B", "B)", "(B)", "B." - not "I am" or "A dog"
    re.compile(r"\(([A-Z])\)"),
    re.compile(r"\b([A-Z])\)"),
]


def mcq_letter(text: str) -> str | None:
    """The option letter chosen in free text: 'B', '(B)', 'B) Paris', 'The answer is C.'"""
    for pattern in _LETTER_PATTERNS:
        match = pattern.search(text)
        if match:
            return match.group(1).upper()
    return None


def _reference_letter(reference: str) -> str | None:
    """The option letter a reference names ('B', '(b)', 'The answer is C'), None for option text."""
    single = reference.strip().upper()
    return mcq_letter(reference) or (single if len(single) == 1 and single in string.ascii_uppercase else None)


def mcq_gen(prediction: str, reference: str, item=None) -> tuple[float, bool]:
    """Multiple choice answered in free text: compare the chosen letter (or option text) with the
    reference letter (or option text)."""
    ref_letter = _reference_letter(reference)
    chosen = mcq_letter(prediction)
    if ref_letter is None:  # the reference is option text
        if not prediction.strip():
            return 0.0, False
        return short_answer(prediction, reference)
    if chosen is None:
        return 0.0, False
    return float(chosen == ref_letter), True


def bleu(prediction: str, reference: str, item=None) -> tuple[float, bool]:
    import sacrebleu

    return float(sacrebleu.sentence_bleu(prediction, [reference]).score), True


def rouge_l(prediction: str, reference: str, item=None) -> tuple[float, bool]:
    """ROUGE-L F1 over whitespace tokens of the normalised texts. Written here because the
    rouge-score package pulls nltk and absl for this one longest-common-subsequence."""
    pred, ref = normalise(prediction).split(), normalise(reference).split()
    if not pred or not ref:
        return 0.0, bool(pred)
    previous = [0] * (len(ref) + 1)
    for p in pred:
        current = [0]
        for j, r in enumerate(ref):
            current.append(previous[j] + 1 if p == r else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0, True
    precision, recall = lcs / len(pred), lcs / len(ref)
    return 2 * precision * recall / (precision + recall), True


def scored_reference(metric: str, reference: str) -> str | None:
    """What a built-in text metric compares answers with, from a row's reference turn: its answer (a <think> block
    taken out, as the runner does) normalised the metric's way. Empty: no answer can be scored against it (for
    exact_match an empty answer would match it). None for metrics that do not compare text this way."""
    from leap_finetune.data.render import split_thinking

    answer = split_thinking(reference)[0]
    if metric in ("exact_match", "short_answer", "rouge_l"):
        return normalise(answer)
    if metric == "mcq_gen":
        return _reference_letter(answer) or normalise(answer)
    if metric == "bleu":
        return answer.strip()
    return None


# what each text metric keeps of a reference (said when a row's reference has nothing left)
NORMALISATION = {
    "exact_match": "lower case, without punctuation and the articles a/an/the",
    "short_answer": "lower case, without punctuation and the articles a/an/the",
    "rouge_l": "lower case, without punctuation and the articles a/an/the",
    "mcq_gen": "an option letter A-Z, else the option text lower case, without punctuation and articles",
    "bleu": "the answer after any <think> block",
}


def tool_call(prediction: str, reference: str, item=None) -> tuple[float, bool]:
    """1 when the turn makes exactly the reference turn's calls (as a set; data/tool_call_score.py). The
    benchmark's sub-scores - parse rate, names, argument F1, no call - are added by the runner."""
    from leap_finetune.data.tool_call_score import score_turn

    scored = score_turn(prediction, item.reference_calls or [])
    return scored.exact, bool(scored.parsed)


def grounding_iou(prediction: str, reference: str, item=None) -> tuple[float, bool]:
    """The answer's boxes against the reference's: IoU, boxes matched one to one (rl/grounding.py); an answer
    without a box scores 0 and is counted as unparsed."""
    from leap_finetune.rl.grounding import answer_score, boxes_in

    score = answer_score(prediction, reference, "iou")
    return (score or 0.0), bool(boxes_in(prediction))


def iou_at_half(prediction: str, reference: str, item=None) -> tuple[float, bool]:
    """1 when grounding_iou reaches 0.5 (the detection convention), else 0."""
    score, parsed = grounding_iou(prediction, reference, item)
    return float(score >= 0.5), parsed


BUILTIN: dict[str, Callable] = {
    "exact_match": exact_match,
    "short_answer": short_answer,
    "mcq_gen": mcq_gen,
    "bleu": bleu,
    "rouge_l": rouge_l,
    "tool_call": tool_call,
    "grounding_iou": grounding_iou,
    "iou@0.5": iou_at_half,
}


def load_metric(metric: str, *, guarded: bool = True) -> Callable:
    """A built-in metric, or `path/to/file.py::function` taking (prediction, reference, row) and
    returning a number (or (number, parsed)). Guarded, a custom metric that raises scores 0 and the
    exception is kept in the returned function's `.errors` (counted as metric_errors)."""
    if metric in BUILTIN:
        return BUILTIN[metric]
    from leap_finetune.config.user_code import load_user_function

    function = load_user_function(
        metric,
        kind="custom metric",
        where=metric.partition("::")[0],
        signature="def {name}(prediction, reference, row) -> float",
    )
    return _guarded(function) if guarded else function


def _guarded(function: Callable) -> Callable:
    errors: list[str] = []

    def metric(prediction: str, reference: str, item=None) -> tuple[float, bool]:
        try:
            value = function(prediction, reference, item)
        except Exception as err:  # noqa: BLE001 - a custom metric must not stop training on odd output
            errors.append(f"{type(err).__name__}: {err}")
            return 0.0, False
        return as_score(value)

    metric.errors = errors
    return metric


def as_score(value) -> tuple[float, bool]:
    """A custom metric's return value as (score, parsed); a value that is not a finite number is unparsed."""
    import math

    parsed = True
    if isinstance(value, tuple) and len(value) == 2:
        value, parsed = value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0, False
    return (number, bool(parsed)) if math.isfinite(number) else (0.0, False)


def check_custom_metric(metric: str, benchmark: str, items) -> None:
    """Run a custom metric on every row's reference answer (as if the model had answered it exactly):
    a metric that raises there would score 0 for every answer during training. Runs the user's code,
    which the config names (docs/evaluation.md, "Benchmarks")."""
    function = load_metric(metric, guarded=False)
    for item in items:
        try:
            value = function(item.reference, item.reference, item)
        except Exception as err:  # noqa: BLE001 - the user's code
            raise LeapError(
                f"custom metric '{metric.rsplit('::', 1)[-1]}' raised {type(err).__name__}: {err} on benchmark "
                f"'{benchmark}' ({item.file}, {item.location}) when scoring the reference answer against itself",
                where=metric.split("::", 1)[0],
                fix="make the metric return a number for every row (it is checked on each row's reference "
                "before training; def name(prediction, reference, row) -> float)",
            ) from None
        number = value[0] if isinstance(value, tuple) and len(value) == 2 else value
        if as_score(value) == (0.0, False) and not (isinstance(value, tuple) and len(value) == 2 and number == 0):
            forgot = " (a function without `return` returns None)" if value is None else ""
            raise LeapError(
                f"custom metric '{metric.rsplit('::', 1)[-1]}' returned {value!r}, not a finite number{forgot}, on "
                f"benchmark '{benchmark}' ({item.file}, {item.location})",
                where=metric.split("::", 1)[0],
                fix="return a float (or a (float, parsed) pair)",
            )
