"""Exact packing for LFM2's short convolutions without the CUDA-only `causal_conv1d` package.

When several sequences are packed into one row, attention keeps them apart through position ids,
but LFM2's depthwise causal convolution (kernel width 3) would mix the last tokens of one sequence
into the first tokens of the next. transformers' reference PyTorch path cannot use `seq_idx` and
raises "causal_conv1d_fn can't keep packed sequences apart without causal_conv1d"
(transformers/integrations/hub_kernels.py), which is why TRL's `packing=True` fails for LFM2 on
CPU and on GPUs without that compiled package. We provide the missing piece: the same convolution
with the taps that cross a sequence boundary zeroed. With a kernel this narrow it is K shifted
multiply-adds, cheap on any device. tests/models/test_packed_conv.py notices if upstream changes.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from leap_finetune.models.architectures import conv_modules

UPSTREAM: dict[str, object] = {}  # module name -> transformers' own causal_conv1d_fn, kept for tests
_PATCHED_MODULES = conv_modules()  # (models/architectures.py: LFM2's and LFM2-MoE's modeling modules)


def packed_causal_conv1d(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    seq_idx: torch.Tensor | None = None,
    **_: object,
) -> torch.Tensor:
    """Causal depthwise conv1d over (batch, channels, length) that never reaches across `seq_idx`
    boundaries. `weight` is (channels, width); output tap `width-1-s` reads the token `s` back."""
    length = hidden_states.shape[-1]
    width = weight.shape[-1]
    x = hidden_states.to(weight.dtype)
    out = x * weight[:, width - 1 : width]
    for shift in range(1, width):
        shifted = F.pad(x, (shift, 0))[..., :length]
        tap = weight[:, width - 1 - shift : width - shift]
        if seq_idx is not None:
            previous = F.pad(seq_idx, (shift, 0), value=-1)[..., :length]
            shifted = shifted * (previous == seq_idx).unsqueeze(1).to(x.dtype)
        out = out + shifted * tap
    if bias is not None:
        out = out + bias[:, None]
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)


def enable_exact_packing() -> str:
    """Install the boundary-aware convolution where the compiled kernel is missing.

    Returns which implementation packed LFM2 batches will use (for the run log)."""
    if importlib.util.find_spec("causal_conv1d") is not None:
        return "causal_conv1d (CUDA kernel)"
    for name in _PATCHED_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        current = getattr(module, "causal_conv1d_fn", None)
        if current is not None and current is not packed_causal_conv1d:
            UPSTREAM[name] = current
            module.causal_conv1d_fn = packed_causal_conv1d
    return "leap-finetune boundary-aware PyTorch convolution"
