"""The distillation loss, over the vocabulary in chunks of tokens.

Both models' logits for every trained token at once would be [tokens x vocab] twice (LFM2: 65,536 entries per
token, 8k tokens -> 2 GiB each in float32, and their softmaxes as much again). Instead the loss takes the two
models' last hidden states of the trained tokens and, a chunk of tokens at a time, applies each model's output
layer, compares the distributions and sums. Each chunk runs under activation checkpointing, so the backward pass
recomputes its logits rather than keeping them: at any moment one chunk's logits are in memory
(tests/recipes/test_distill_loss.py: equal to the loss over the full logits, values and gradients).

Per token, with p_t the teacher's and p_s the student's distribution at `temperature`:
- forward_kl: KL(p_t || p_s) = sum p_t (log p_t - log p_s)
- reverse_kl: KL(p_s || p_t)
- jsd: beta x KL(p_t || m) + (1 - beta) x KL(p_s || m), m = beta p_t + (1 - beta) p_s (TRL's generalised JSD:
  beta 0 is forward_kl, 1 reverse_kl)
times temperature^2 (Hinton et al.: the gradient keeps its scale as the temperature softens the targets), blended
with SFT's cross-entropy on the dataset's token: (1 - mix) x divergence + mix x cross-entropy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CHUNK_TOKENS = 1024  # tokens per chunk: ~0.25 GiB of float32 logits per model at LFM2's vocabulary


@dataclass(frozen=True)
class DistillLoss:
    loss: str = "forward_kl"
    beta: float = 0.5
    temperature: float = 1.0
    mix: float = 0.0
    vocab: int | None = None  # the shared tokenizer's size: output layers padded beyond it are cut to it

    def per_token(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor):
        """(loss, divergence, cross-entropy), each per token, from full logits of the tokens."""
        if self.vocab is not None:
            student_logits, teacher_logits = student_logits[:, : self.vocab], teacher_logits[:, : self.vocab]
        student_logits, teacher_logits = student_logits.float(), teacher_logits.float()
        t = self.temperature
        student = F.log_softmax(student_logits / t, dim=-1)
        teacher = F.log_softmax(teacher_logits / t, dim=-1)
        divergence = self._divergence(student, teacher) * (t * t)
        cross_entropy = F.cross_entropy(student_logits, targets, reduction="none")
        return (1 - self.mix) * divergence + self.mix * cross_entropy, divergence, cross_entropy

    def _divergence(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        beta = self.beta
        if self.loss == "forward_kl" or (self.loss == "jsd" and beta == 0):
            return _kl(teacher, student)
        if self.loss == "reverse_kl" or (self.loss == "jsd" and beta == 1):
            return _kl(student, teacher)
        mixture = torch.logsumexp(torch.stack([student + math.log(1 - beta), teacher + math.log(beta)]), dim=0)
        return beta * _kl(teacher, mixture) + (1 - beta) * _kl(student, mixture)


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, from log-probabilities (0 log 0 = 0)."""
    return (p_log.exp() * (p_log - q_log)).sum(-1)


def chunked_loss(
    spec: DistillLoss,
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    student_head,
    teacher_head,
    targets: torch.Tensor,
    chunk: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the summed loss over the tokens, with gradients to the student; [divergence sum, cross-entropy sum, tokens
    the student's top-1 got right, tokens where its top-1 is the teacher's], detached). Hidden states: [tokens, H]."""
    total = student_hidden.new_zeros((), dtype=torch.float32)
    stats = torch.zeros(4, device=student_hidden.device)

    def one_chunk(hidden, teacher_part, target):
        # (each head in its own weights' dtype: autocast left the student's hidden states float32 or half)
        student_logits = student_head(hidden.to(student_head.weight.dtype))
        with torch.no_grad():
            teacher_logits = teacher_head(teacher_part.to(teacher_head.weight.dtype))
        loss, divergence, cross_entropy = spec.per_token(student_logits, teacher_logits, target)
        with torch.no_grad():
            top = student_logits.argmax(-1)
            found = torch.stack(
                [
                    divergence.sum(),
                    cross_entropy.sum(),
                    (top == target).sum().float(),
                    (top == teacher_logits.argmax(-1)).sum().float(),
                ]
            )
        return loss.sum(), found

    for start in range(0, student_hidden.shape[0], chunk):
        part = slice(start, start + chunk)
        if torch.is_grad_enabled() and student_hidden.requires_grad:
            loss, found = checkpoint(
                one_chunk, student_hidden[part], teacher_hidden[part], targets[part], use_reentrant=False
            )
        else:
            loss, found = one_chunk(student_hidden[part], teacher_hidden[part], targets[part])
        total = total + loss
        stats = stats + found.detach()
    return total, stats


def chunked_top_k_loss(
    spec: DistillLoss,
    student_hidden: torch.Tensor,
    student_head,
    teacher_ids: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    targets: torch.Tensor,
    chunk: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss against a served teacher's top-k (recipes/distill_server.py): at each token the target is the
    teacher's distribution over its K likeliest tokens, renormalised at `temperature` (q), and the divergence is
    sum_k q_k (log q_k - log p_s(k)) with the student's log-probabilities over the whole vocabulary - forward KL
    with the teacher's tail left out: the student is pulled towards the K tokens and away from every other
    (tests/recipes/test_distill_server.py: with K = the vocabulary it is chunked_loss's forward_kl). A token with no
    teacher entry (-inf everywhere) adds no divergence. Stats as chunked_loss's, plus the teacher's probability
    mass in its top-k (at temperature 1), summed."""
    total = student_hidden.new_zeros((), dtype=torch.float32)
    stats = torch.zeros(5, device=student_hidden.device)
    t = spec.temperature

    def one_chunk(hidden, ids, logprobs, target):
        logits = student_head(hidden.to(student_head.weight.dtype)).float()
        if spec.vocab is not None:
            logits = logits[:, : spec.vocab]
        student = F.log_softmax(logits / t, dim=-1)
        known = torch.isfinite(logprobs[:, :1]).squeeze(1)
        teacher = torch.log_softmax(logprobs.float() / t, dim=-1).nan_to_num(nan=-math.inf)
        picked = student.gather(-1, ids.clamp(max=student.shape[-1] - 1))
        weights = teacher.exp()
        divergence = (weights * (teacher.clamp(min=-1e30) - picked)).sum(-1) * (t * t)
        divergence = torch.where(known, divergence, torch.zeros_like(divergence))
        cross_entropy = F.cross_entropy(logits, target, reduction="none")
        loss = (1 - spec.mix) * divergence + spec.mix * cross_entropy
        with torch.no_grad():
            top = logits.argmax(-1)
            found = torch.stack(
                [
                    divergence.sum(),
                    cross_entropy.sum(),
                    (top == target).sum().float(),
                    ((top == ids[:, 0]) & known).sum().float(),
                    logprobs.float().exp().sum(-1).sum(),
                ]
            )
        return loss.sum(), found

    for start in range(0, student_hidden.shape[0], chunk):
        part = slice(start, start + chunk)
        pieces = (student_hidden[part], teacher_ids[part], teacher_logprobs[part], targets[part])
        if torch.is_grad_enabled() and student_hidden.requires_grad:
            loss, found = checkpoint(one_chunk, *pieces, use_reentrant=False)
        else:
            loss, found = one_chunk(*pieces)
        total = total + loss
        stats = stats + found.detach()
    return total, stats
