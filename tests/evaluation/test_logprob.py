"""Log-prob multiple choice: scores equal a direct computation with the model; batched == naive."""

from __future__ import annotations

import pytest
import torch

from leap_finetune.config.schema_evals import EvalsConfig
from leap_finetune.data.chat_templates import load_chat_template
from leap_finetune.data.render import Renderer
from leap_finetune.evaluation.logprob import option_sequences, score_options, score_sequences
from leap_finetune.evaluation.rows import BenchmarkItem
from leap_finetune.evaluation.runner import LoadedBenchmark, _logprob
from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

QUESTIONS = [
    ([{"role": "user", "content": "Capital of France?"}], ["Paris.", "Rome, surely.", "Berlin"], 0),
    (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        ["4", "five", "22", "four!"],
        3,
    ),
    ([{"role": "user", "content": "Color of a banana?"}], ["yellow", "a deep and vivid blue"], 0),
]


@pytest.fixture(scope="module")
def setup():
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    model = build_tiny_model("tiny-lfm2", tokenizer).eval()
    model.config.use_cache = False
    renderer = Renderer(tokenizer, load_chat_template("lfm2", tokenizer), "all", None)
    return tokenizer, model, renderer


def direct_logprob(model, tokenizer, prompt_text: str, option: str) -> float:
    """Independent of leap-finetune's code: log p(option | prompt) from one forward pass."""
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(prompt_text + option, add_special_tokens=False)["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([full_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return sum(logprobs[i - 1, full_ids[i]].item() for i in range(len(prompt_ids), len(full_ids)))


def test_option_scores_equal_a_direct_computation(setup):
    tokenizer, model, renderer = setup
    for prompt, options, _ in QUESTIONS:
        prompt_text = renderer.prompt_text(prompt)
        assert prompt_text.endswith("<|im_start|>assistant\n")
        scores = score_options(model, renderer, prompt, options)
        for score, option in zip(scores, options):
            assert score.logprob == pytest.approx(direct_logprob(model, tokenizer, prompt_text, option), abs=1e-4)
            assert score.tokens == len(tokenizer(option, add_special_tokens=False)["input_ids"])


def test_batched_scores_equal_one_forward_per_option(setup):
    tokenizer, model, renderer = setup
    naive = [s.logprob for prompt, options, _ in QUESTIONS for s in score_options(model, renderer, prompt, options)]
    sequences = [seq for prompt, options, _ in QUESTIONS for seq in option_sequences(renderer, prompt, options)]
    for batch_size in (1, 4, 64):
        batched = score_sequences(model, sequences, batch_size=batch_size, pad_id=tokenizer.pad_token_id)
        assert batched == pytest.approx(naive, abs=1e-4)


def test_accuracies_by_sum_per_token_and_per_char(setup):
    tokenizer, model, renderer = setup
    items = [
        BenchmarkItem("b.jsonl", f"line {i}", p, options=o, answer_id=a) for i, (p, o, a) in enumerate(QUESTIONS, 1)
    ]
    metrics, predictions = _logprob(
        model,
        renderer,
        EvalsConfig(benchmarks=[{"name": "x", "path": "b", "metric": "logprob_mcq"}]),
        LoadedBenchmark("x", "logprob_mcq", items),
    )
    expected = {"sum": 0, "tok": 0, "char": 0}
    for (prompt, options, answer), prediction in zip(QUESTIONS, predictions):
        scores = score_options(model, renderer, prompt, options)
        expected["sum"] += max(range(len(options)), key=lambda i: scores[i].logprob) == answer
        expected["tok"] += max(range(len(options)), key=lambda i: scores[i].logprob / scores[i].tokens) == answer
        expected["char"] += max(range(len(options)), key=lambda i: scores[i].logprob / len(options[i])) == answer
        assert prediction["option_logprobs"] == pytest.approx([round(s.logprob, 4) for s in scores], abs=1e-3)
    assert metrics["score"] == expected["sum"] / 3
    assert metrics["accuracy_per_token"] == expected["tok"] / 3
    assert metrics["accuracy_per_char"] == expected["char"] / 3
