"""`distill.mode: on_policy` (GKD, Agarwal et al.): each training batch's answers are sampled from the student itself,
and the divergence is taken on those tokens - the student learns the teacher's distribution where the student goes,
not only where the dataset's answers go (offline distillation trains on contexts the student would not produce).

For each row of a (padded) batch: the prompt is every token before its first trained token (the conversation up to
the first assistant answer, as SFT's mask says), the student samples one answer to it (up to
`distill.max_new_tokens`, at `distill.temperature`, stopping at its end-of-turn token), and the row becomes prompt +
sampled answer, the answer trained. The sampling runs the student in evaluation mode, without gradients, on
leap-finetune's rollout sampler (rl/sampler.py, as GRPO's: a static cache, on a GPU a bf16 copy of the student
refreshed each step and the decoding step in one CUDA graph) - or, where the sampler cannot apply the settings
(`rl.sampler.why_not`), on transformers' generate with the compiled layers set to eager (decoding shapes change every
step). `sampler_for` says which, once.
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


def sampler_for(model, *, max_new_tokens: int, temperature: float, eos: list[int], pad: int, bf16: bool):
    """(leap-finetune's sampler for the student, None) - or (None, why generate samples instead)."""
    from transformers import GenerationConfig

    from leap_finetune.rl.sampler import Sampler, why_not

    config = GenerationConfig(
        do_sample=True, temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
        cache_implementation="static", eos_token_id=eos, pad_token_id=pad,
    )  # fmt: skip
    reason = why_not(model, config)
    if reason is not None:
        return None, reason
    cuda = next(model.parameters()).device.type == "cuda"
    # (on a GPU: decoding on a bf16 copy, refreshed from the trained weights at each sampling, as GRPO's rollouts; the
    # copy's layers are plain ones - the student's compiled layers are its own - and the sampler compiles its step)
    if cuda and not bf16:
        return None, "no bf16 on this GPU: the sampler decodes on a bf16 copy of the student"
    dtype = torch.bfloat16 if cuda else None
    return Sampler(model, config, list(eos), pad, compile=cuda, rollout_dtype=dtype), None


@torch.no_grad()
def sample_answers(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    eos: list[int],
    pad: int,
    sampler=None,
):
    """One sampled answer per prompt, cut after its first end token (on `sampler` where given)."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    was_training = model.training
    model.eval()
    if sampler is not None:
        try:
            out = sampler.generate(input_ids, mask, max_new_tokens)
        finally:
            if was_training:
                model.train()
        return _cut(out.tolist(), eos)
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
    return _cut(out[:, width:].tolist(), eos)


def _cut(rows: list[list[int]], eos: list[int]) -> list[list[int]]:
    answers = []
    for row in rows:
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
