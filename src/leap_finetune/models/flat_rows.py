"""Padded batches run through the model as one flat row: padding-free DPO and KTO for LFM2.

TRL 1.16's DPO and KTO trainers hand the model padded (rows, length) batches - their padding-free
path is disabled - and ~45% of a DPO batch's positions are padding (bench/NOTES.md). The trainers
then only read per-token outputs of the real positions (the fused LM head skips labels of -100).
So the decoder can skip the padding without the trainer knowing: the collator (on the CPU, no wait
for the GPU) adds `flat_rows` - where each real token sits in the padded batch and where each row
starts - and hooks on the LFM2 backbone flatten the batch into one row (varlen attention, the
boundary-aware convolution: the same per-row results as the padded batch) and put the hidden states
back in the padded layout before the LM head. Rows of the flat batch are padded to a multiple of 8
tokens with one-token documents (the GEMM alignment of recipes/speed.py), which are dropped again.
"""

from __future__ import annotations

import torch

KEY = "flat_rows"


def flat_rows(attention_mask: torch.Tensor, multiple: int = 8) -> dict:
    """Where the real tokens of a right- or left-padded batch go in one flat row (CPU tensors)."""
    mask = attention_mask.reshape(-1).bool()
    index = mask.nonzero().flatten()
    lengths = attention_mask.sum(dim=1).to(torch.int64)
    total = int(lengths.sum())
    extra = (-total) % multiple
    lengths = torch.cat([lengths[lengths > 0], torch.ones(extra, dtype=torch.int64)])  # the padding: 1-token rows
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    starts = torch.repeat_interleave(cu[:-1], lengths)
    positions = torch.arange(total + extra) - starts
    return {
        "index": index,
        "extra": torch.tensor(extra),
        "position_ids": positions[None],
        "cu_seq_lens": cu.to(torch.int32),
        "max_length": int(lengths.max()) if lengths.numel() else 0,
        "seq_idx": torch.repeat_interleave(torch.arange(lengths.numel(), dtype=torch.int32), lengths)[None],
    }


class FlatRowsCollator:
    """Wraps a trainer's collator: its batch, plus `flat_rows` computed from its attention mask."""

    def __init__(self, collator, multiple: int = 8):
        self.collator, self.multiple = collator, multiple

    def __call__(self, examples):
        batch = self.collator(examples)
        if "attention_mask" in batch and batch["attention_mask"].dim() == 2:
            batch[KEY] = flat_rows(batch["attention_mask"], self.multiple)
        return batch

    def __getattr__(self, name):  # (pad_token_id, ... of the wrapped collator)
        if name == "collator":  # (not set yet: a copy being unpickled in a data-loader worker)
            raise AttributeError(name)
        return getattr(self.collator, name)


def _flatten(module, args, kwargs):
    flat = kwargs.pop(KEY, None)
    if flat is None:
        return args, kwargs
    if args or kwargs.get("input_ids") is None or kwargs.get("past_key_values") is not None:
        module._leap_flat = None  # (not a training-shaped call: left as it is)
        return args, kwargs
    ids = kwargs["input_ids"]
    rows, length = ids.shape
    tokens = ids.reshape(-1)[flat["index"]]
    extra = int(flat["position_ids"].shape[1]) - tokens.shape[0]
    if extra:
        pad = getattr(module.config, "pad_token_id", None) or 0
        tokens = torch.cat([tokens, tokens.new_full((extra,), pad)])
    kwargs["input_ids"] = tokens[None]
    kwargs["position_ids"] = flat["position_ids"]
    kwargs["attention_mask"] = {"full_attention": None, "conv": None}  # (as models/varlen_attention.py)
    kwargs["cu_seq_lens_q"] = kwargs["cu_seq_lens_k"] = flat["cu_seq_lens"]
    kwargs["max_length_q"] = kwargs["max_length_k"] = flat["max_length"]
    kwargs["seq_idx"] = flat["seq_idx"]
    module._leap_flat = (rows, length, flat["index"])
    return args, kwargs


def _unflatten(module, args, kwargs, output):
    shape = getattr(module, "_leap_flat", None)
    if shape is None:
        return output
    module._leap_flat = None
    rows, length, index = shape
    hidden = output.last_hidden_state[0, : index.shape[0]]
    padded = hidden.new_zeros(rows * length, hidden.shape[-1]).index_copy(0, index, hidden)
    output.last_hidden_state = padded.view(rows, length, hidden.shape[-1])
    return output


def enable(model) -> bool:
    """Hook the LFM2 backbone of `model` (text LFM2 / LFM2-MoE); False when it is not one."""
    backbone = getattr(model, "model", None)
    if getattr(getattr(model, "config", None), "model_type", None) not in ("lfm2", "lfm2_moe") or backbone is None:
        return False
    if not getattr(backbone, "_leap_flat_rows", False):
        backbone.register_forward_pre_hook(_flatten, with_kwargs=True)
        backbone.register_forward_hook(_unflatten, with_kwargs=True)
        backbone._leap_flat_rows = True
    return True
