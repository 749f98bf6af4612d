"""LFM2-VL's vision encoder over its pictures' real patches only, packed into one sequence.

transformers' Lfm2VlImageProcessor pads every picture (a tile, a thumbnail, an image resized whole) to its most
patches - 1,024 with LiquidAI's settings - and SigLIP2 runs all its layers over that padding; the attention mask
hides it from the result, not from the work or the activations kept for the backward. A 256x256 image uses 256 of
its 1,024 patches, a thumbnail often fewer. Here the encoder takes the real patches of every picture of the batch
as one sequence: the per-patch layers (projections, MLP, norms) run over real patches only, and attention stays
within each picture - the varlen flash kernel PyTorch ships (torch.nn.attention.varlen) on a GPU, SDPA per picture
elsewhere (exact: tests/models/test_picture_padding.py). The output is padded back to the shape transformers
expects (the projector reads real patches only).

Done by class: the encoder and its attention layers become subclasses of transformers' own (no copied code, and a
copy, a pickle or peft's wrappers keep them); requests this path does not serve (attentions or hidden states
asked for) go to transformers' forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from leap_finetune.models.varlen_attention import _KERNEL


def pack_vision_encoder(model) -> bool:
    """LFM2-VL's vision encoder (SigLIP2) made to run packed; True when it was changed (once per model)."""
    tower = getattr(getattr(model, "model", None), "vision_tower", None)
    if tower is None or getattr(tower, "_leap_packed", False):
        return False
    if not (hasattr(tower, "embeddings") and hasattr(tower, "encoder") and hasattr(tower, "post_layernorm")):
        return False  # (not the SigLIP2 layout transformers 5 builds: left as it is)
    tower.__class__ = _packed_class(type(tower), _PackedEncoderMixin)
    for layer in tower.encoder.layers:
        layer.self_attn.__class__ = _packed_class(type(layer.self_attn), _PackedAttentionMixin)
    tower._leap_packed = True
    return True


_CLASSES: dict[tuple[type, type], type] = {}


def _packed_class(base: type, mixin: type) -> type:
    """One subclass per transformers class (kept, so that pickling finds the same class again)."""
    key = (base, mixin)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"Packed{base.__name__}", (mixin, base), {"__module__": __name__})
        globals()[_CLASSES[key].__name__] = _CLASSES[key]
    return _CLASSES[key]


class _PackedEncoderMixin:
    def forward(self, pixel_values, pixel_attention_mask, spatial_shapes, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        wants = ("output_attentions", "output_hidden_states")
        if (
            pixel_attention_mask is None
            or any(kwargs.get(k) for k in wants)
            or getattr(self.config, "vision_use_head", False)
        ):
            return super().forward(pixel_values, pixel_attention_mask, spatial_shapes, **kwargs)
        hidden = self.embeddings(pixel_values, spatial_shapes)  # (pictures, patches, width)
        real = pixel_attention_mask.bool()
        lengths = real.sum(-1)
        boundaries = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        packed = hidden[real][None]  # (1, real patches, width)
        longest = int(lengths.max()) if lengths.numel() else 0
        for layer in self.encoder.layers:
            packed = layer(packed, None, leap_boundaries=boundaries, leap_longest=longest)
        packed = self.post_layernorm(packed)
        out = packed.new_zeros(hidden.shape)
        out[real] = packed[0]
        return BaseModelOutputWithPooling(last_hidden_state=out, pooler_output=None)


class _PackedAttentionMixin:
    def forward(self, hidden_states, attention_mask=None, leap_boundaries=None, leap_longest=0, **kwargs):
        if leap_boundaries is None:
            return super().forward(hidden_states, attention_mask, **kwargs)
        total = hidden_states.shape[1]
        shape = (total, -1, self.head_dim)  # (patches, heads, dim)
        q = self.q_proj(hidden_states)[0].view(shape)
        k = self.k_proj(hidden_states)[0].view(shape)
        v = self.v_proj(hidden_states)[0].view(shape)
        out = _attend(q, k, v, leap_boundaries, leap_longest, self.scale)
        return self.out_proj(out.reshape(1, total, -1)), None


_kernel_failed = False  # (set once the varlen kernel has refused: the per-picture path from then on)


def _attend(q, k, v, boundaries, longest: int, scale: float):
    """Each picture's patches attend to that picture's patches (no causal mask: an encoder)."""
    if q.is_cuda and torch.is_autocast_enabled("cuda") and q.dtype == torch.float32:
        q, k, v = (t.to(torch.get_autocast_dtype("cuda")) for t in (q, k, v))  # (as SDPA under autocast)
    global _kernel_failed
    if q.is_cuda and _KERNEL is not None and q.dtype in (torch.bfloat16, torch.float16) and not _kernel_failed:
        try:
            return _KERNEL(q, k, v, boundaries, boundaries, longest, longest, scale=scale)
        except (RuntimeError, TypeError, ValueError) as err:  # (a torch whose kernel refuses these inputs)
            import warnings

            _kernel_failed = True
            warnings.warn(
                f"vision encoder: the varlen attention kernel failed ({type(err).__name__}: {str(err)[:160]}); "
                "attending per picture from here on (the same result, slower)",
                stacklevel=2,
            )
    outputs = []
    bounds = boundaries.tolist()
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            qd, kd, vd = (t[start:end].transpose(0, 1) for t in (q, k, v))  # (heads, patches, dim)
            outputs.append(F.scaled_dot_product_attention(qd, kd, vd, scale=scale).transpose(0, 1))
    return torch.cat(outputs) if outputs else q
