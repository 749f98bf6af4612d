"""What SFT on a GPU uses when the user did not say: the fast settings that train the same tokens
with the same loss as the plain path, chosen per machine and model, and said in one log line.

Measured on the H200 (bench/RESULTS.md, bench/NOTES.md):
- padding-free batches (the batch's conversations flattened into one row, no padding tokens) with
  varlen flash attention and the boundary-aware convolution: the same conversations per step and the
  same loss as padded batches, 1.47x faster on LFM2-1.2B.
- torch.compile of each decoder layer (regional compilation): the layers repeat, so only two graphs
  (convolution block, attention block) are compiled, in seconds rather than minutes; the LM head and
  TRL's fused loss stay eager (compiling the whole model measured a loss of 0 on the H200).
"""

from __future__ import annotations

from dataclasses import dataclass

from leap_finetune.models.registry import model_type
from leap_finetune.models.varlen_attention import SUPPORTED_MODEL_TYPES


def varlen_kernel_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class SpeedPlan:
    padding_free: bool
    compile_layers: bool
    line: str  # what was chosen, for the run log


def plan(training: dict, model_id: str, cuda: bool) -> SpeedPlan:
    """The user's `padding_free` / `compile_layers` win; unset ones are chosen here."""
    reason = None
    kind = model_type(model_id)
    if not cuda:
        reason = "CPU"
    elif kind not in SUPPORTED_MODEL_TYPES:
        reason = f"model type {kind or 'unknown'} (the fast path is verified for LFM2)"
    elif not varlen_kernel_available():
        reason = "no varlen flash attention in this torch (needs torch >= 2.10)"
    fast = reason is None
    packing = bool(training.get("packing"))
    padding_free = bool(training.get("padding_free", fast and not packing))
    compile_layers = bool(training.get("compile_layers", fast))
    if packing:
        batches = "packing (bfd)"
    elif padding_free:
        batches = "padding-free batches"
    else:
        batches = "padded batches"
    chosen = [batches] + (["torch.compile per decoder layer"] if compile_layers else [])
    line = "speed: " + ", ".join(chosen)
    if reason is not None and not {"padding_free", "compile_layers"} <= set(training):
        line += f" ({reason})"
    elif fast:
        line += " (padding_free / compile_layers: false turn them off)"
    return SpeedPlan(padding_free, compile_layers, line)


def compile_layers(model) -> int:
    """Compile each decoder layer in place (regional compilation); returns how many."""
    import torch._dynamo

    layers = _decoder_layers(model)
    # All layers share one forward (Lfm2DecoderLayer's) but come in two kinds (convolution, attention),
    # and padding-free batches change length every step: a few graphs per kind. The default limit (8)
    # was measured to be hit on LFM2-1.2B, after which layers silently ran eagerly.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 512)
    for layer in layers:
        layer.compile()
    return len(layers)


def _decoder_layers(model):
    inner = getattr(model, "model", None)
    inner = getattr(inner, "language_model", inner)  # a vision-language model: its language model's layers
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers to compile")
    return list(layers)
