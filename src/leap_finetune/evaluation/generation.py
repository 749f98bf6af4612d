"""Batched generation for benchmarks: left padding, the chat template's generation prompt, greedy
by default, stopping at the end-of-turn token."""

from __future__ import annotations

import torch


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], *, max_new_tokens: int, batch_size: int,
             do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0) -> list[str]:
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    outputs = []
    for start in range(0, len(prompts), batch_size):
        encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts[start:start + batch_size]]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device)
        kwargs = {"do_sample": do_sample}
        if do_sample:
            kwargs.update(temperature=temperature, top_p=top_p)
        generated = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                                   eos_token_id=eos, pad_token_id=pad, use_cache=True, **kwargs)
        for row in generated[:, width:].tolist():
            if eos in row:
                row = row[: row.index(eos)]
            outputs.append(tokenizer.decode([t for t in row if t != pad], skip_special_tokens=False).strip())
    return outputs
