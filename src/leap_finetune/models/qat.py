"""Quantization-aware training (`qat: {target: q4_0}`): the linear layers train through the rounding their weights
will get in the shipped file, so the weights learn to sit where the quantizer keeps them.

Each targeted linear layer's forward uses `fake_quant(weight)` - the weight quantized and dequantized exactly as the
target format does it - with a straight-through gradient (the backward pass treats the rounding as the identity).
The weights themselves stay in their training precision and are saved as plain weights: the export quantizes them
with the same format (`export RUN --gguf q4_0`), and then the file holds the values the model trained through.

Why our own fake quantization, not torchao's: torchao's int4/int8 fake quantizers are symmetric with scale
max|x| / 7.5 (int4) or / 127.5 and round half to even; llama.cpp's q4_0 takes the block's signed extreme value
over -8 as its scale (so the extreme value maps exactly to -8 and the grid is asymmetric), keeps the scale in
float16, and truncates x/d + 8.5; q8_0 rounds half away from zero. A fake quantizer that differs trains the
weights toward another grid. These match llama.cpp's reference quantizers value for value (tested against the
gguf package's port of ggml-quants.c). MLX's 4-bit is not offered: leap-finetune exports no MLX file to ship it
in, and its affine rounding (the group's larger end kept exact) needs its own port and test. k-quants (q4_k_m: super-blocks with 6-bit scales found by a search) cannot be reproduced by a per-block formula: not
offered.
"""

from __future__ import annotations

import torch

# target -> (values per block along the input dimension, description)
TARGETS = {
    "q4_0": (32, "llama.cpp q4_0: blocks of 32, a float16 scale, 4-bit values"),
    "q8_0": (32, "llama.cpp q8_0: blocks of 32, a float16 scale, 8-bit values"),
}


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    index = blocks.abs().argmax(dim=-1, keepdim=True)
    extreme = blocks.gather(-1, index)  # (signed: the extreme value maps to -8 exactly)
    d = extreme / -8
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(blocks * inverse + 8.5).clamp(0, 15)
    return (q - 8) * d.half().float()


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    scaled = (blocks * inverse).abs()
    whole = torch.floor(scaled)
    # C's roundf (half away from zero) as gguf's port computes it: floor(a + 0.5) would round 0.49999997 up
    q = torch.sign(blocks) * (whole + torch.floor(2 * (scaled - whole)))
    return q * d.half().float()


_FORMATS = {"q4_0": _q4_0, "q8_0": _q8_0}


def quantized(weight: torch.Tensor, target: str) -> torch.Tensor:
    """The weight as the target format stores it (quantized, then dequantized), in the weight's dtype; blocks run
    along each row (the input dimension), as llama.cpp lays them out."""
    block = TARGETS[target][0]
    rows, columns = weight.shape
    blocks = weight.detach().float().reshape(rows, columns // block, block)
    return _FORMATS[target](blocks).reshape(rows, columns).to(weight.dtype)


def fake_quant(weight: torch.Tensor, target: str) -> torch.Tensor:
    """`quantized` in the forward pass, the identity in the backward (straight-through)."""
    return weight + (quantized(weight, target) - weight).detach()


def can_quantize(module, target: str) -> bool:
    """A linear layer whose rows split into whole blocks (llama.cpp keeps other tensors in a wider type)."""
    weight = getattr(module, "weight", None)
    return (
        isinstance(module, torch.nn.Linear)
        and weight is not None
        and weight.dim() == 2
        and weight.shape[1] % TARGETS[target][0] == 0
    )


class QatState:
    """Whether the forward passes use the quantized weights now (from `start_step` on; models/qat.py's patched
    forwards read it, recipes/callbacks.QatSwitch sets it)."""

    def __init__(self, target: str, start_step: int):
        self.target, self.start_step, self.active = target, start_step, start_step == 0


def _is_lora_layer(module) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "scaling")


def apply(model, target: str, start_step: int, state: QatState | None = None) -> tuple[QatState, int]:
    """Patch every linear layer of the language model that the target format quantizes (not the LM head, which
    llama.cpp keeps wider, nor a vision tower): its forward runs through `fake_quant` while the state is active.
    A LoRA layer is quantized as it will be exported - merged: fake_quant(W + scale x B A) - so the adapters learn
    against the rounding of the weight that ships. Returns the state and how many layers were patched."""
    state = state if state is not None else QatState(target, start_step)
    patched = 0
    # a LoRA layer's parts (its base layer, the adapters' own small linear layers) run inside its merged forward
    inside_lora = {id(part) for m in model.modules() if _is_lora_layer(m) for part in m.modules() if part is not m}
    for name, module in model.named_modules():
        if "lm_head" in name or "vision" in name or "projector" in name:
            continue
        if _is_lora_layer(module) and can_quantize(module.base_layer, target):
            module.forward = _lora_forward(module, module.forward, state)
        elif id(module) not in inside_lora and can_quantize(module, target):
            module.forward = _linear_forward(module, state)
        else:
            continue
        module._leap_qat_state = state  # (rl/sampler.py's rollout copy rounds through the same state)
        patched += 1
    return state, patched


def state_of(model) -> QatState | None:
    """The QAT state a model's layers were patched with (None: no QAT)."""
    return next((m._leap_qat_state for m in model.modules() if hasattr(m, "_leap_qat_state")), None)


def _linear_forward(module, state: QatState):
    def forward(x):
        weight = fake_quant(module.weight, state.target) if state.active else module.weight
        return torch.nn.functional.linear(x, weight, module.bias)

    return forward


def _lora_forward(module, original, state: QatState):
    def forward(x, *args, **kwargs):
        if not state.active or module.disable_adapters or module.merged:
            return original(x, *args, **kwargs)
        base = module.base_layer
        weight = base.weight
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                delta = module.lora_B[adapter].weight @ module.lora_A[adapter].weight
                weight = weight + delta.to(weight.dtype) * module.scaling[adapter]
        return torch.nn.functional.linear(x, fake_quant(weight, state.target), base.bias)

    return forward
