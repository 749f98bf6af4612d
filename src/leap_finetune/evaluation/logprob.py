"""Log-prob multiple choice: each option is scored as the assistant's reply to the rendered prompt,
by the sum of its tokens' log-probabilities, and the highest wins.

Batched: the (prompt + option) sequences of many questions go through the model together, right
padded, a batch of `batch_size` sequences per forward pass. Each option is scored in its own
sequence (the prompt is re-encoded per option) because LFM2's short convolutions would mix options
packed into one sequence; attention-only models could share the prompt, LFM2 cannot exactly.

Rows with images (a vision-language model): the processor expands each `<image>` of the sequence's
text into the image's tokens and supplies the pixel values; the option's tokens are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from leap_finetune.data.render import Renderer, split_completion


@dataclass
class OptionScore:
    logprob: float  # sum over the option's tokens
    tokens: int


class OptionSequence(NamedTuple):
    ids: list[int]  # prompt + option tokens
    start: int  # where the option starts
    end: int  # where it ends
    text: str  # what `ids` encode (the processor re-encodes it when the row has images)
    images: tuple[str, ...] = ()


def option_sequences(
    renderer: Renderer, prompt: list[dict], options: list[str], images: list[str] | None = None
) -> list[OptionSequence]:
    """One sequence per option. The end-of-turn token after the option is not scored: the question
    is which reply, not where it stops."""
    eos = renderer._special["eos_token"]
    eos_tokens = len(renderer.tokenizer(eos, add_special_tokens=False)["input_ids"]) if eos else 0
    sequences = []
    prompt_text = renderer.prompt_text(prompt)  # rendered once per question
    for option in options:
        part = split_completion(renderer, prompt, [{"role": "assistant", "content": option}], None, prompt_text)
        text = part.prompt_text + part.completion_text
        suffix = 0
        if eos and part.completion_text.endswith(eos):
            suffix, text = eos_tokens, text[: -len(eos)]
        scored = part.completion_ids[: len(part.completion_ids) - suffix]
        start = len(part.prompt_ids)
        sequences.append(
            OptionSequence(part.prompt_ids + scored, start, start + len(scored), text, tuple(images or ()))
        )
    return sequences


@torch.no_grad()
def score_sequences(
    model, sequences: list[OptionSequence], *, batch_size: int, pad_id: int, processor=None
) -> list[float]:
    """Sum of log p(token | everything before it) over [start, end) of each sequence."""
    device = next(model.parameters()).device
    scores = []
    for first in range(0, len(sequences), batch_size):
        chunk = sequences[first : first + batch_size]
        pixels = {}
        if processor is not None and any(seq.images for seq in chunk):
            chunk, pixels = _expand_images(processor, chunk, device, model.dtype)
        width = max(len(seq.ids) for seq in chunk)
        input_ids = torch.tensor([seq.ids + [pad_id] * (width - len(seq.ids)) for seq in chunk], device=device)
        attention = torch.tensor([[1] * len(seq.ids) + [0] * (width - len(seq.ids)) for seq in chunk], device=device)
        logits = model(input_ids=input_ids, attention_mask=attention, use_cache=False, **pixels).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
        targets = input_ids[:, 1:]
        token_logprobs = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        for row, seq in enumerate(chunk):
            scores.append(token_logprobs[row, seq.start - 1 : seq.end - 1].sum().item())
    return scores


def _expand_images(processor, chunk: list[OptionSequence], device, dtype):
    """Each sequence with images re-encoded by the processor. `<image>` is a special token, so the
    text around it encodes exactly as before: the expanded sequence ends with the same option tokens."""
    from leap_finetune.models.vision import open_image

    rows = [i for i, seq in enumerate(chunk) if seq.images]
    inputs = processor(
        text=[chunk[i].text for i in rows],
        images=[[open_image(path) for path in chunk[i].images] for i in rows],
        padding=True,
        return_tensors="pt",
    )
    expanded = list(chunk)
    for position, i in enumerate(rows):
        seq = chunk[i]
        ids = inputs["input_ids"][position][inputs["attention_mask"][position].bool()].tolist()
        shift = len(ids) - len(seq.ids)
        if ids[seq.start + shift :] != seq.ids[seq.start :]:
            raise RuntimeError("the processor encoded an option differently from the tokenizer")  # a bug, not data
        expanded[i] = seq._replace(ids=ids, start=seq.start + shift, end=seq.end + shift)
    pixels = {
        key: (value.to(device, dtype) if value.is_floating_point() else value.to(device))
        for key, value in inputs.items()
        if key not in ("input_ids", "attention_mask")
    }
    return expanded, pixels


def score_options(model, renderer: Renderer, prompt: list[dict], options: list[str]) -> list[OptionScore]:
    """The naive path: one forward pass per option (the reference the batched path is checked against)."""
    results = []
    for sequence in option_sequences(renderer, prompt, options):
        [logprob] = score_sequences(model, [sequence], batch_size=1, pad_id=0)
        results.append(OptionScore(logprob, sequence.end - sequence.start))
    return results
