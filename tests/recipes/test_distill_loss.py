"""The distillation loss (recipes/distill_loss.py): taken a chunk of tokens at a time under activation
checkpointing, it equals the loss over the full logits - value and gradients - for every divergence; each divergence
is the textbook one on hand-made distributions; mix blends in the cross-entropy; and a chunk's logits are all that
is in memory at once."""

from __future__ import annotations

import math

import pytest
import torch

from leap_finetune.recipes.distill_loss import DistillLoss, chunked_loss


def _models(seed: int = 0, hidden: int = 16, vocab: int = 40):
    torch.manual_seed(seed)
    return torch.nn.Linear(hidden, vocab, bias=False), torch.nn.Linear(hidden, vocab + 8, bias=False)  # (padded)


@pytest.mark.parametrize("spec", [DistillLoss("forward_kl"), DistillLoss("reverse_kl"), DistillLoss("jsd", beta=0.3),
                                  DistillLoss("jsd", beta=0.0), DistillLoss("forward_kl", temperature=2.0, mix=0.25)])  # fmt: skip
def test_the_chunked_loss_equals_the_loss_over_the_full_logits(spec):
    spec = DistillLoss(spec.loss, spec.beta, spec.temperature, spec.mix, vocab=40)
    student_head, teacher_head = _models()
    hidden = torch.randn(37, 16, requires_grad=True)
    teacher_hidden = torch.randn(37, 16)
    targets = torch.randint(0, 40, (37,))
    loss, stats = chunked_loss(spec, hidden, teacher_hidden, student_head, teacher_head, targets, chunk=8)
    loss.backward()
    chunked_grads = hidden.grad.clone(), student_head.weight.grad.clone()
    assert teacher_head.weight.grad is None  # (the teacher learns nothing)
    hidden.grad, student_head.weight.grad = None, None
    full, divergence, cross_entropy = spec.per_token(student_head(hidden), teacher_head(teacher_hidden), targets)
    full.sum().backward()
    assert torch.allclose(loss, full.sum(), rtol=1e-5, atol=1e-5)
    assert torch.allclose(chunked_grads[0], hidden.grad, atol=1e-6)
    assert torch.allclose(chunked_grads[1], student_head.weight.grad, atol=1e-6)
    assert torch.allclose(stats[0], divergence.sum().detach(), rtol=1e-5) and torch.allclose(
        stats[1], cross_entropy.sum().detach(), rtol=1e-5
    )


def test_each_divergence_is_the_textbook_one():
    p_t, p_s = torch.tensor([[0.7, 0.2, 0.1]]), torch.tensor([[0.2, 0.5, 0.3]])
    teacher, student = p_t.log(), p_s.log()
    target = torch.tensor([0])
    kl = lambda p, q: float((p * (p / q).log()).sum())  # noqa: E731
    assert DistillLoss("forward_kl").per_token(student, teacher, target)[1].item() == pytest.approx(
        kl(p_t, p_s), rel=1e-5
    )
    assert DistillLoss("reverse_kl").per_token(student, teacher, target)[1].item() == pytest.approx(
        kl(p_s, p_t), rel=1e-5
    )
    m = 0.5 * p_t + 0.5 * p_s
    jsd = 0.5 * kl(p_t, m) + 0.5 * kl(p_s, m)
    assert DistillLoss("jsd", beta=0.5).per_token(student, teacher, target)[1].item() == pytest.approx(jsd, rel=1e-5)
    assert DistillLoss("jsd", beta=1.0).per_token(student, teacher, target)[1].item() == pytest.approx(
        kl(p_s, p_t), rel=1e-5
    )
    # temperature: both softened, times T^2
    soft = DistillLoss("forward_kl", temperature=2.0).per_token(student, teacher, target)[1].item()
    p_t2, p_s2 = torch.softmax(teacher / 2, -1), torch.softmax(student / 2, -1)
    assert soft == pytest.approx(4 * kl(p_t2, p_s2), rel=1e-5)
    # mix: the cross-entropy of the dataset's token blended in
    loss, divergence, cross_entropy = DistillLoss("forward_kl", mix=0.25).per_token(student, teacher, target)
    assert cross_entropy.item() == pytest.approx(-math.log(0.2), rel=1e-5)
    assert loss.item() == pytest.approx(0.75 * divergence.item() + 0.25 * cross_entropy.item(), rel=1e-5)
    # a student that is the teacher: no divergence
    assert DistillLoss("jsd").per_token(teacher, teacher, target)[1].abs().item() < 1e-6


def test_without_gradients_no_checkpointing_is_needed():
    student_head, teacher_head = _models(1)
    hidden, targets = torch.randn(5, 16), torch.randint(0, 40, (5,))
    with torch.no_grad():
        loss, stats = chunked_loss(
            DistillLoss(vocab=40), hidden, torch.randn(5, 16), student_head, teacher_head, targets
        )
    assert loss.item() > 0 and 0 <= stats[2].item() <= 5 and 0 <= stats[3].item() <= 5
