"""A served teacher (recipes/distill_server.py, evaluation/serve_scores.py, recipes/distill_loss.py
`chunked_top_k_loss`): the top-k loss is forward KL - with K the whole vocabulary it equals the full loss, values and
gradients - and with fewer tokens the teacher's distribution over its top K, renormalised; the server's
prompt_logprobs are the model's own log-probabilities (its top K in order, the prompt's token with its rank); the
documents of padded, packed and padding-free batches are found where the model sees them; a request the server
cannot take is a 400 saying what is expected."""

from __future__ import annotations

import math

import pytest
import torch

from leap_finetune.evaluation.serve import BadRequest
from leap_finetune.evaluation.serve_scores import prompt_logprobs, read_scoring
from leap_finetune.recipes.distill_loss import DistillLoss, chunked_loss, chunked_top_k_loss
from leap_finetune.recipes.distill_server import documents


def _heads(vocab: int = 40, hidden: int = 16):
    torch.manual_seed(0)
    return torch.nn.Linear(hidden, vocab, bias=False), torch.nn.Linear(hidden, vocab, bias=False)


@pytest.mark.parametrize(("temperature", "mix"), [(1.0, 0.0), (2.0, 0.25)])
def test_top_k_over_the_whole_vocabulary_is_the_full_forward_kl(temperature, mix):
    spec = DistillLoss("forward_kl", temperature=temperature, mix=mix, vocab=40)
    student_head, teacher_head = _heads()
    hidden = torch.randn(29, 16, requires_grad=True)
    teacher_hidden, targets = torch.randn(29, 16), torch.randint(0, 40, (29,))
    full, _ = chunked_loss(spec, hidden, teacher_hidden, student_head, teacher_head, targets, chunk=8)
    full.backward()
    expected_grad = hidden.grad.clone()
    hidden.grad = None
    teacher = teacher_head(teacher_hidden).detach().log_softmax(-1)
    logprobs, ids = teacher.topk(40, dim=-1)  # (the server's answer with K = the vocabulary)
    loss, stats = chunked_top_k_loss(spec, hidden, student_head, ids, logprobs, targets, chunk=8)
    loss.backward()
    assert torch.allclose(loss, full, rtol=1e-5, atol=1e-5)
    assert torch.allclose(hidden.grad, expected_grad, atol=1e-6)
    assert stats[4].item() == pytest.approx(29, rel=1e-5)  # (all the teacher's mass is in its top 40)


def test_with_fewer_tokens_the_target_is_the_renormalised_top_k_and_unknown_positions_add_nothing():
    spec = DistillLoss("forward_kl")
    student_logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    head = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(4))
    teacher = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    ids, logprobs = torch.tensor([[1, 0]]), teacher[[1, 0]][None]
    loss, stats = chunked_top_k_loss(spec, student_logits, head, ids, logprobs, torch.tensor([0]))
    q = torch.tensor([0.3, 0.5]) / 0.8  # (tokens 1 and 0, renormalised)
    student = student_logits.log_softmax(-1)[0]
    expected = float((q * (q.log() - student[[1, 0]])).sum())
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats[4].item() == pytest.approx(0.8, rel=1e-5)  # the mass the two tokens hold
    none = torch.full((1, 2), -math.inf)
    nothing, _ = chunked_top_k_loss(spec, student_logits, head, ids, none, torch.tensor([0]))
    assert nothing.item() == 0.0


def test_the_servers_prompt_logprobs_are_the_models_own():
    from leap_finetune.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer("tiny-lfm2", {})
    model = load_model("tiny-lfm2", tokenizer, {}, dtype=torch.float32).eval()
    prompts = [tokenizer("the red door is open")["input_ids"], tokenizer("a b")["input_ids"]]
    answers = prompt_logprobs(model, tokenizer, prompts, 5)
    for prompt, entries in zip(prompts, answers, strict=True):
        assert entries[0] is None and len(entries) == len(prompt)
        with torch.no_grad():
            own = model(input_ids=torch.tensor([prompt])).logits[0].log_softmax(-1)
        for position, entry in enumerate(entries[1:]):
            ranked = sorted(entry.items(), key=lambda item: item[1]["rank"])
            top = own[position].topk(5)
            assert [int(t) for t, v in ranked[:5]] == top.indices.tolist()
            assert [v["logprob"] for t, v in ranked[:5]] == pytest.approx(top.values.tolist(), abs=1e-4)
            token = str(prompt[position + 1])
            assert entry[token]["logprob"] == pytest.approx(float(own[position, prompt[position + 1]]), abs=1e-4)
            assert entry[token]["rank"] == int((own[position] > own[position, prompt[position + 1]]).sum()) + 1


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"prompt": "text", "prompt_logprobs": 5}, "token ids"),
        ({"prompt": [1, -2], "prompt_logprobs": 5}, "non-negative"),
        ({"prompt": [1, 2]}, "prompt_logprobs"),
        ({"prompt": [1, 2], "prompt_logprobs": 5, "max_tokens": 16}, "generates nothing"),
    ],
)
def test_a_request_the_server_cannot_take_says_what_is_expected(body, said):
    with pytest.raises(BadRequest, match=said):
        read_scoring(body)


def test_documents_are_found_as_the_model_sees_them():
    ids = torch.arange(12).reshape(2, 6)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert documents(ids, mask, None) == [(0, 0, 4), (1, 0, 6)]  # padded rows: up to the mask's length
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])  # packed / padding-free: a document starts at position 0
    assert documents(ids[:1], None, positions) == [(0, 0, 3), (0, 3, 5)]  # (the 1-token document has no target)


def test_teacher_gpus_without_the_servers_web_stack_is_refused_with_the_install_line(monkeypatch):
    """(found on the GPU machine: leap-finetune's own server exited at once there without FastAPI)"""
    import sys
    from types import SimpleNamespace

    from leap_finetune.errors import LeapError
    from leap_finetune.launch.checks import check_teacher_server
    from leap_finetune.launch.devices import plan_devices

    monkeypatch.setitem(sys.modules, "fastapi", None)
    resolved = SimpleNamespace(config_path="config.yaml", distill={"teacher_gpus": 1})
    with pytest.raises(LeapError, match="needs fastapi") as info:
        check_teacher_server(resolved, plan_devices(gpus=2, teacher=1))
    assert "pip install 'leap-finetune[serve]'" in info.value.format()
    check_teacher_server(resolved, plan_devices(gpus=1))  # (no teacher GPUs: nothing to start, nothing asked)
