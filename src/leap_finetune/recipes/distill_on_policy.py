"""`distill.mode: on_policy` (GKD, Agarwal et al.): each training batch's answers are sampled from the student itself,
and the divergence is taken on those tokens - the student learns the teacher's distribution where the student goes,
not only where the dataset's answers go (offline distillation trains on contexts the student would not produce).

For each row of a (padded) batch: the prompt is every token before its first trained token (the conversation up to
the first assistant answer, as SFT's mask says), the student samples one answer to it (up to
`distill.max_new_tokens`, at `distill.temperature`, stopping at its end-of-turn token), and the row becomes prompt +
sampled answer, the answer trained. The sampling runs the student in evaluation mode with its cache, its compiled
layers set to eager (decoding shapes change every step), and no gradients.
"""

from __future__ import annotations

import torch


def prompts_of(input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's tokens before its first trained token (right-padded rows; a row with no trained token: all)."""
    prompts = []
    for ids, row_labels, mask in zip(
        input_ids, labels, attention_mask if attention_mask is not None else [None] * len(labels)
    ):
        length = int(mask.sum()) if mask is not None else len(ids)
        trained = (row_labels[:length] != -100).nonzero()
        end = int(trained[0]) if len(trained) else length
        prompts.append(ids[:end].tolist())
    return prompts


@torch.no_grad()
def sample_answers(
    model, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, eos: list[int], pad: int
):
    """One sampled answer per prompt, cut after its first end token."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    was_training = model.training
    model.eval()
    stance = torch.compiler.set_stance("force_eager")
    stance.__enter__()
    try:
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            eos_token_id=eos,
            pad_token_id=pad,
            use_cache=True,
        )
    finally:
        stance.__exit__(None, None, None)
        if was_training:
            model.train()
    answers = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        answers.append(row[:end])
    return answers


def on_policy_batch(prompts: list[list[int]], answers: list[list[int]], pad: int, device) -> dict:
    """Right-padded rows of prompt + sampled answer; labels on the answer tokens only."""
    rows = [p + a for p, a in zip(prompts, answers, strict=True)]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        input_ids[i, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        labels[i, len(prompt) : len(prompt) + len(answer)] = torch.tensor(answer, dtype=torch.long)
        mask[i, : len(prompt) + len(answer)] = 1
    return {"input_ids": input_ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}
