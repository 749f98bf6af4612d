"""Log-prob multiple choice: each option is scored as the assistant's reply to the rendered prompt,
by the sum of its tokens' log-probabilities, and the highest wins.

Batched: the (prompt + option) sequences of many questions go through the model together, right
padded, a batch of `batch_size` sequences per forward pass. Each option is scored in its own
sequence (the prompt is re-encoded per option) because LFM2's short convolutions would mix options
packed into one sequence; attention-only models could share the prompt, LFM2 cannot exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from leap_finetune.data.render import Renderer, split_completion


@dataclass
class OptionScore:
    logprob: float  # sum over the option's tokens
    tokens: int
    chars: int


def option_sequences(renderer: Renderer, prompt: list[dict], options: list[str]) -> list[tuple[list[int], int, int]]:
    """For each option: (prompt + option token ids, where the option starts, where it ends). The
    end-of-turn token after the option is not scored: the question is which reply, not where it stops."""
    eos = renderer._special["eos_token"]
    eos_tokens = len(renderer.tokenizer(eos, add_special_tokens=False)["input_ids"]) if eos else 0
    sequences = []
    prompt_text = renderer.prompt_text(prompt)  # rendered once per question
    for option in options:
        part = split_completion(renderer, prompt, [{"role": "assistant", "content": option}], None, prompt_text)
        suffix = eos_tokens if eos and part.completion_text.endswith(eos) else 0
        scored = part.completion_ids[: len(part.completion_ids) - suffix]
        sequences.append((part.prompt_ids + scored, len(part.prompt_ids), len(part.prompt_ids) + len(scored)))
    return sequences


@torch.no_grad()
def score_sequences(model, sequences: list[tuple[list[int], int, int]], *, batch_size: int, pad_id: int) -> list[float]:
    """Sum of log p(token | everything before it) over [start, end) of each sequence."""
    device = next(model.parameters()).device
    scores = []
    for first in range(0, len(sequences), batch_size):
        chunk = sequences[first:first + batch_size]
        width = max(len(ids) for ids, _, _ in chunk)
        input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _, _ in chunk], device=device)
        attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _, _ in chunk], device=device)
        logits = model(input_ids=input_ids, attention_mask=attention, use_cache=False).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
        targets = input_ids[:, 1:]
        token_logprobs = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        for row, (_, start, end) in enumerate(chunk):
            scores.append(token_logprobs[row, start - 1:end - 1].sum().item())
    return scores


def score_options(model, renderer: Renderer, prompt: list[dict], options: list[str]) -> list[OptionScore]:
    """The naive path: one forward pass per option (the reference the batched path is checked against)."""
    results = []
    for ids, start, end in option_sequences(renderer, prompt, options):
        [logprob] = score_sequences(model, [(ids, start, end)], batch_size=1, pad_id=0)
        results.append(OptionScore(logprob, end - start, 0))
    for result, option in zip(results, options, strict=True):
        result.chars = len(option)
    return results
