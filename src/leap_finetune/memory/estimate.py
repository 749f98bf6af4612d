"""The predicted peak GPU memory of a training process, in parts: weights, gradients, optimizer state, activations,
and the rest (CUDA workspaces, the allocator's slack, compiled graphs).

Worked out from the model's shape (memory/shapes.py: its config alone) and the run's settings, then scaled by the
constants that measured runs fitted (memory/calibration.py: the table of measured peaks, with the device and date).
"""

from __future__ import annotations

from dataclasses import dataclass

from leap_finetune.memory.calibration import FIT, VISION_FIT
from leap_finetune.memory.shapes import ModelShape

GIB = 2**30
# bytes per trainable parameter of the optimizer's state (two moments for the Adam family)
OPTIMIZER_BYTES = {"adamw_8bit": 2, "paged_adamw_8bit": 2, "adamw_bnb_8bit": 2, "paged_adamw_32bit": 8, "sgd": 0}
# bitsandbytes' 4-bit weights: half a byte per weight, plus a scale per block of 64 (double quantization: 8-bit
# scales with a float32 scale per 256 of them)
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)


@dataclass(frozen=True)
class Memory:
    """Bytes of each part of a process's peak; `peak` their sum. `cache`: what rollouts hold beside training (the
    sampler's bf16 copy and static KV caches, colocated vLLM's share) or a server's KV cache (memory/servers.py)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    other: float
    cache: float = 0.0

    @property
    def peak(self) -> float:
        """The backward frees the activations as it makes the gradients (and the optimizer step's gradients are
        released before the next forward): the peak holds the larger of the two (measured: bench/memory.py)."""
        return self.weights + self.optimizer + max(self.activations, self.gradients) + self.other + self.cache

    def to_json(self) -> dict:
        """`plan --json`'s form: GiB, two decimals."""
        parts = ("peak", "weights", "gradients", "optimizer", "activations", "other", "cache")
        return {f"{part}_gib": round(getattr(self, part) / GIB, 2) for part in parts}

    def parts(self) -> str:
        names = ("weights", "gradients", "optimizer", "activations", "other") + (("cache",) if self.cache else ())
        return ", ".join(f"{name} {getattr(self, name) / GIB:.1f}" for name in names)


@dataclass(frozen=True)
class Setup:
    """What decides a training process's memory, read from the resolved config (memory/plan.py)."""

    tokens: int  # tokens of the largest micro-batch one forward holds (DPO: chosen and rejected together)
    logit_tokens: int  # of those, the tokens whose logits the loss needs at once
    weight_bytes: float  # bytes per weight as loaded: 4 (float32 master), 2 (bf16), NF4_BYTES (QLoRA's linears)
    lora_parameters: int  # 0: a full fine-tune
    lora_dropout: bool = False  # LoRA's dropout keeps a dropped copy of each adapted layer's input and its mask
    optim: str = "adamw_torch_fused"
    optimizer_precision: str | None = None  # "bf16_kahan": bf16 weights and states with a Kahan buffer
    checkpointing: bool = False
    reference: bool = False  # a frozen second copy (DPO/KTO full fine-tune or adapter_path; GRPO with beta > 0)
    pairs: bool = False  # DPO/KTO: chosen and rejected (or KL) rows in one forward
    frozen_vision: bool = False  # LFM2-VL with the vision encoder and projector not trained
    qat: bool = False  # quantization-aware training (models/qat.py)
    teacher_bytes: float = 0  # distill: the frozen teacher's weights (bf16) beside the student
    vision_patches: int = 0  # LFM2-VL: the patches the vision encoder runs over in the largest micro-batch
    vision_trained: bool = False  # gradients reach the vision encoder (trained in full, or LoRA on its layers)


def training_memory(shape: ModelShape, setup: Setup) -> Memory:
    """The peak of one training process (each DDP worker holds the same)."""
    lora = setup.lora_parameters > 0
    frozen = shape.vision_parameters if setup.frozen_vision and not lora else 0
    trainable = setup.lora_parameters if lora else shape.parameters - frozen
    master = 2 if setup.optimizer_precision and setup.optimizer_precision.startswith("bf16") else 4
    if lora:
        weights = _base_bytes(shape, setup.weight_bytes) + 4 * trainable  # (adapters in float32)
        trained_bytes = 4
    else:
        trained_bytes = min(setup.weight_bytes, master) if setup.weight_bytes >= 2 else 2
        weights = trained_bytes * trainable + 2 * frozen
    if setup.reference:  # (with LoRA only for adapter_path: the base + that adapter as DPO's reference, a copy)
        weights += min(max(setup.weight_bytes, 2), 4) * shape.parameters
    weights += setup.teacher_bytes
    # bf16 autocast over float32 weights keeps a bf16 copy of each linear weight a forward used until backward
    if setup.weight_bytes == 4:
        weights += 2 * _linear_parameters(shape)
    elif setup.qat:  # (no autocast copy to reuse: each rounded linear weight is kept for the backward itself)
        weights += max(setup.weight_bytes, 2) * _linear_parameters(shape)
    gradients = trained_bytes * trainable
    optimizer = _optimizer_bytes(setup, trained_bytes) * trainable
    return Memory(weights, gradients, optimizer, activation_bytes(shape, setup), FIT.other_bytes)


def _base_bytes(shape: ModelShape, weight_bytes: float) -> float:
    """A LoRA base: QLoRA quantizes the language model's linear layers only (embeddings, norms, the vision tower and
    projector stay bf16: config/quantization.py)."""
    linear = sum(i * o for n, (i, o) in shape.linear.items() if "vision_tower" not in n and "projector" not in n)
    if weight_bytes < 2:
        return weight_bytes * linear + 2 * (shape.parameters - linear)
    return weight_bytes * shape.parameters


def _linear_parameters(shape: ModelShape) -> int:
    return sum(i * o for i, o in shape.linear.values())


def _optimizer_bytes(setup: Setup, trained_bytes: int) -> float:
    if setup.optimizer_precision and setup.optimizer_precision.startswith("bf16"):
        return 6  # (two bf16 moments and a bf16 Kahan compensation buffer: torch-optimi)
    for name, per in OPTIMIZER_BYTES.items():
        if setup.optim.startswith(name):
            return per
    return 2 * trained_bytes  # (AdamW's two moments in the weights' dtype)


def activation_bytes(shape: ModelShape, setup: Setup) -> float:
    """What the forward keeps for the backward at the largest micro-batch: bytes per token, layer and hidden unit
    (LFM2's MLP is 4-5x the hidden size, so one constant holds both; LoRA's own constant: a frozen
    layer keeps no input for a weight gradient, and with lora_dropout each adapted layer keeps a dropped copy of it); with
    checkpointing each layer's input and one layer recomputed at a time; the logits over the vocabulary (SFT: TRL
    computes the loss in chunks; DPO's pairs: measured inside the per-layer constant); and the vision encoder's."""
    if setup.checkpointing:
        kept = shape.hidden * (FIT.checkpoint_layer_bytes * shape.layers + FIT.checkpoint_extra_bytes)
    else:
        lora = FIT.lora_layer_bytes + FIT.lora_dropout_layer_bytes * setup.lora_dropout
        kept = (lora if setup.lora_parameters else FIT.layer_bytes) * shape.hidden * shape.layers
    logits = (0 if setup.pairs else FIT.logit_bytes) * shape.vocab * setup.logit_tokens
    return _with_vision(kept * setup.tokens + logits, shape, setup)


def _with_vision(language: float, shape: ModelShape, setup: Setup) -> float:
    """The vision encoder (SigLIP2) runs over every picture of the micro-batch before the language model: bytes per
    patch, vision layer and vision hidden unit, as the language model's per token (VISION_FIT: measured GRPO on
    pictures). A frozen encoder keeps nothing for the backward: only one layer's tensors at a time while its no-grad
    forward runs, freed before the language model's forward begins - the larger of the two is the peak."""
    pictures = setup.vision_patches * shape.vision_hidden
    one_layer = VISION_FIT.layer_bytes * pictures
    if not setup.vision_trained:
        return max(language, one_layer)
    if setup.checkpointing:  # (each layer's input, and the one layer recomputed at a time)
        return language + VISION_FIT.checkpoint_layer_bytes * pictures * shape.vision_layers + one_layer
    return language + one_layer * shape.vision_layers
