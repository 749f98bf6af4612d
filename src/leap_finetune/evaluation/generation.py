"""Batched generation for benchmarks: left padding, the chat template's generation prompt, greedy
by default, stopping at the end-of-turn token. Rows with images go through the model's processor
(a vision-language model), which expands each `<image>` and adds the pixel values."""

from __future__ import annotations

import torch

from leap_finetune.models.vision import open_image


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    batch_size: int,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    images: list[list] | None = None,  # per prompt: image paths / URLs, or PIL images
    processor=None,
) -> list[str]:
    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    outputs = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        batch_images = images[start : start + batch_size] if images else [[] for _ in batch]
        if processor is not None and any(batch_images):
            inputs = _with_images(processor, batch, batch_images, device, model.dtype)
        else:
            encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in batch]
            width = max(len(ids) for ids in encoded)
            inputs = {
                "input_ids": torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded], device=device),
                "attention_mask": torch.tensor(
                    [[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device
                ),
            }
        width = inputs["input_ids"].shape[1]
        kwargs = {"do_sample": do_sample}
        if do_sample:
            kwargs.update(temperature=temperature, top_p=top_p)
        generated = model.generate(
            **inputs, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, use_cache=True, **kwargs
        )
        for row in generated[:, width:].tolist():
            if eos in row:
                row = row[: row.index(eos)]
            outputs.append(tokenizer.decode([t for t in row if t != pad], skip_special_tokens=False).strip())
    return outputs


def _with_images(processor, texts: list[str], image_paths: list[list], device, dtype) -> dict:
    """Left-padded processor inputs; pixel values in the model's dtype. An image is a path or URL (opened here)
    or a PIL image (the evaluation server's, decoded from the request)."""
    tokenizer = processor.tokenizer
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        inputs = processor(
            text=texts,
            images=[[open_image(p) if isinstance(p, str) else p for p in paths] for paths in image_paths],
            padding=True,
            return_tensors="pt",
        )
    finally:
        tokenizer.padding_side = side
    return {
        key: (value.to(device, dtype) if value.is_floating_point() else value.to(device))
        for key, value in inputs.items()
    }
