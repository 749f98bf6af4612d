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

import types

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
        "shape": tuple(attention_mask.shape),  # (rows, length) of the padded batch it was computed for
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


class ColumnsCollator(FlatRowsCollator):
    """sentence-transformers' collator: `<column>_flat_rows` for every text column's attention mask (the trainer
    hands each column's keys to the model without the prefix)."""

    def __call__(self, examples):
        batch = self.collator(examples)
        for key in [k for k in batch if k.endswith("_attention_mask")]:
            mask = batch[key]
            if isinstance(mask, torch.Tensor) and mask.dim() == 2:
                batch[key[: -len("attention_mask")] + KEY] = flat_rows(mask, self.multiple)
        return batch


def _plain_call(args, kwargs) -> bool:
    """A training-shaped call: padded input_ids by keyword, no cache, only the last hidden state read."""
    return not (
        args
        or kwargs.get("input_ids") is None
        or kwargs.get("input_ids").dim() != 2
        or kwargs.get("past_key_values") is not None
        or kwargs.get("cache") is not None
        or kwargs.get("output_hidden_states")
        or kwargs.get("cu_seq_lens_q") is not None
    )


def _flatten(module, args, kwargs):
    flat = kwargs.pop(KEY, None)
    module._leap_flat = None
    if not _plain_call(args, kwargs):
        return args, kwargs  # (generation, hidden states of every layer: left as it is)
    ids = kwargs["input_ids"]
    if flat is not None and tuple(flat["shape"]) != tuple(ids.shape):
        flat = None  # computed for the whole batch, this is a slice of it (a cached loss's mini-batch)
    mask = kwargs.get("attention_mask")
    from_mask = isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape == ids.shape
    if getattr(getattr(module, "config", None), "output_hidden_states", False):
        return args, kwargs  # (every layer's hidden states asked for: they would come back flat)
    if flat is None and getattr(module, "_leap_flat_from_mask", False) and from_mask:
        # (one wait for the GPU: the layout is computed on the host, as the collator would)
        flat = {k: _to(v, ids.device) for k, v in flat_rows(mask.cpu(), module._leap_flat_multiple).items()}
    if flat is None:
        return args, kwargs
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


def _flat_forward(self, *args, **kwargs):
    args, kwargs = _flatten(self, args, kwargs)
    return _unflatten(self, args, kwargs, self._leap_flat_original(*args, **kwargs))


def _to(value, device):
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


def enable(model, from_mask: bool = False, multiple: int = 8) -> bool:
    """Hook the LFM2 backbone of `model` (text LFM2 / LFM2-MoE: a causal LM's `.model`, or the backbone itself as
    sentence-transformers loads it); False when it is not one. `from_mask`: padded batches without `flat_rows`
    are flattened too, laid out from their attention mask."""
    from leap_finetune.models.architectures import supports

    if not supports(getattr(getattr(model, "config", None), "model_type", None), "flat_rows"):
        return False
    backbone = model if hasattr(model, "layers") else getattr(model, "model", None)
    if backbone is None or not hasattr(backbone, "layers"):
        return False
    backbone._leap_flat_from_mask, backbone._leap_flat_multiple = from_mask, multiple
    if backbone is model and not getattr(backbone, "_leap_flat_rows", False):
        # sentence-transformers calls the backbone's `.forward` itself, past the module hooks: the instance's
        # forward is wrapped instead (a bound method: a deep copy of the model wraps the copy; the class stays, so
        # the saved config names the model's own architecture). Whatever forward the instance had (an
        # accelerate hook) still runs. (No DataParallel replica copies it: every training process has one GPU.)
        backbone._leap_flat_original = backbone.forward
        backbone.forward = types.MethodType(_flat_forward, backbone)
        backbone._leap_flat_rows = True
    if not getattr(backbone, "_leap_flat_rows", False):
        backbone.register_forward_pre_hook(_flatten, with_kwargs=True)
        backbone.register_forward_hook(_unflatten, with_kwargs=True)
        backbone._leap_flat_rows = True
    return True
