"""Attention for packed (padding-free) LFM2 batches without a dense mask.

With packing, TRL's padding-free collator flattens a batch into one row and passes the document
boundaries (`cu_seq_lens_q`, `max_length_q`) down to every attention layer. transformers' `sdpa`
ignores them: it rebuilds a (total x total) block-diagonal boolean mask from the position ids,
so attention costs (sum of lengths)^2 instead of sum(length^2), and SDPA's flash kernel cannot
take a mask at all. That is why packing measured slower than padding on the H200. `flash_attention_2`
would use the boundaries, but needs the separately compiled flash-attn package.

PyTorch (>= 2.10) ships the flash-attention varlen kernel itself (`torch.nn.attention.varlen`), so
we register it as an attention implementation for transformers: documents attend only to
themselves, no mask is built, and nothing extra must be installed. On CPU (no such kernel) each
document goes through SDPA on its own: exact, for tests and laptops. Padded batches (evaluation,
generation) keep using SDPA with their padding mask.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from leap_finetune.models.architectures import architecture
from leap_finetune.models.registry import VARLEN_MODEL_TYPES

NAME = "leap_varlen"
# Model types whose attention layers pass the collator's boundaries through (models/registry.py, checked by
# tests/models/test_varlen_attention.py); other models keep transformers' own packing path.
SUPPORTED_MODEL_TYPES = VARLEN_MODEL_TYPES


def _find_kernel():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, frozenset()
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


# Looked up once at import: inside a compiled layer, `inspect.signature` would break the graph.
_KERNEL, _KERNEL_PARAMS = _find_kernel()


def varlen_attention_forward(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs
):
    """transformers' attention-function signature: query/key/value are (batch, heads, length, dim);
    returns ((batch, length, heads, dim), None)."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None and attention_mask is None and query.shape[0] == 1 and query.shape[2] > 1:
        cu_seq_lens = _boundaries_from_positions(kwargs.get("position_ids"))  # packed without boundaries
    if cu_seq_lens is None or query.shape[0] != 1 or attention_mask is not None:  # a padded batch
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (total, heads, dim)
    groups = q.shape[1] // k.shape[1]
    if q.dtype == torch.float32 and q.is_cuda and torch.is_autocast_enabled("cuda"):
        # float32 master weights under bf16 autocast: SDPA would run in bf16 here too (autocast casts
        # its inputs); the flash kernel takes only 16-bit inputs, so cast as autocast would.
        q, k, v = (t.to(torch.get_autocast_dtype("cuda")) for t in (q, k, v))
    if q.is_cuda and _KERNEL is not None and q.dtype in (torch.bfloat16, torch.float16):
        options = {"scale": scaling}
        if "is_causal" in _KERNEL_PARAMS:  # torch 2.9's signature
            options["is_causal"] = True
        else:
            options["window_size"] = (-1, 0)  # causal
        if groups > 1:
            if "enable_gqa" in _KERNEL_PARAMS:
                options["enable_gqa"] = True
            else:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        max_length = int(kwargs.get("max_length_q") or int(cu_seq_lens.diff().max()))
        out = _KERNEL(q, k, v, cu_seq_lens, cu_seq_lens, max_length, max_length, **options)
    else:
        out = _per_document_sdpa(q, k, v, cu_seq_lens, scaling, groups)
    return out.unsqueeze(0), None


def _boundaries_from_positions(position_ids):
    """Documents restart their position ids at 0; None when the row holds one document."""
    if position_ids is None or position_ids.shape[0] != 1:
        return None
    starts = (position_ids[0] == 0).nonzero().flatten()
    if starts.numel() <= 1:
        return None
    end = torch.tensor([position_ids.shape[1]], device=starts.device)
    return torch.cat([starts, end]).to(torch.int32)


def _per_document_sdpa(q, k, v, cu_seq_lens, scaling, groups):
    """The reference path (CPU): each document attends causally to itself alone."""
    if torch.compiler.is_compiling():
        return _block_diagonal_sdpa(q, k, v, cu_seq_lens, scaling, groups)
    bounds = cu_seq_lens.tolist()
    outputs = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end == start:
            continue
        qd, kd, vd = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (heads, length, dim)
        if groups > 1:
            kd, vd = kd.repeat_interleave(groups, dim=0), vd.repeat_interleave(groups, dim=0)
        outputs.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scaling).transpose(0, 1))
    return torch.cat(outputs, dim=0)


def _block_diagonal_sdpa(q, k, v, cu_seq_lens, scaling, groups):
    """The CPU path inside a compiled layer: one SDPA call with a block-diagonal causal mask built from the
    boundaries by tensor operations. The per-document loop reads the boundaries on the host, which breaks the
    graph and recompiles it for every new document count; this traces once for any count and length. It costs
    (total length)^2 instead of sum(length^2), which only compiled layers on a CPU pay (not a default)."""
    positions = torch.arange(q.shape[0], device=q.device)
    document = torch.searchsorted(cu_seq_lens[1:].to(positions.dtype), positions, right=True)
    mask = (document[:, None] == document[None, :]) & (positions[:, None] >= positions[None, :])
    qd, kd, vd = (t.transpose(0, 1) for t in (q, k, v))  # (heads, total, dim)
    if groups > 1:
        kd, vd = kd.repeat_interleave(groups, dim=0), vd.repeat_interleave(groups, dim=0)
    return F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scaling).transpose(0, 1)


def varlen_mask(*args, attention_mask=None, **kwargs):
    """No dense mask for a padding-free batch (the boundaries travel as cu_seq_lens); a padded
    batch gets SDPA's usual mask."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def _no_mask_for_flat_batches(module, args, kwargs):
    """Forward pre-hook of the LFM2 model: a flat batch that carries its document boundaries (TRL's padding-free
    collator) needs no mask - varlen attention reads the boundaries and the convolution `seq_idx`. Without this,
    transformers' create_causal_mask looks for packed sequences in the position ids with a `.all()` that makes
    the host wait for the GPU in every forward pass. A per-layer-type mask mapping is the documented way to hand
    LFM2 its masks (Lfm2Model.forward skips building them)."""
    if (
        kwargs.get("attention_mask") is None
        and kwargs.get("cu_seq_lens_q") is not None
        and kwargs.get("past_key_values") is None
        and kwargs.get("cache") is None  # (transformers 5.24's LFM2 name for the cache)
        and not args  # (input_ids passed by keyword, as every caller in transformers and TRL does)
    ):
        kwargs["attention_mask"] = {"full_attention": None, "conv": None}
    return args, kwargs


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, varlen_mask)


def use_varlen_attention(model) -> str | None:
    """Switch a packed LFM2 model to varlen attention; returns what packed batches will use (for the
    run log), or None when the model is not one we verified."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return None
    if getattr(config, "_attn_implementation", None) not in (None, "sdpa", "eager", NAME):
        return None  # the user chose one (flash_attention_2, flex_attention): keep it
    register()
    if architecture(config.model_type).vision:
        # only the language model's attention: the vision encoder (SigLIP2) attends within each image
        # (pixel_attention_mask), not over the flattened batch
        language = model.model.language_model
        if getattr(language.config, "_attn_implementation", None) not in (None, "sdpa", "eager", NAME):
            return None
        language.set_attn_implementation(NAME)
    else:
        model.set_attn_implementation(NAME)
        language = getattr(model, "model", None)
    if language is not None and not getattr(language, "_leap_flat_hook", False):  # (all three build masks alike)
        language.register_forward_pre_hook(_no_mask_for_flat_batches, with_kwargs=True)
        language._leap_flat_hook = True
    if torch.cuda.is_available() and _KERNEL is not None:
        return "varlen flash attention (torch.nn.attention.varlen)"
    return "per-document SDPA (no CUDA varlen kernel here)"
