"""The constants of the memory estimate (memory/estimate.py) and the measured peaks they were fitted to.

`MEASURED` is the table: each row a run through leap-finetune's real path on one GPU (`bench/memory.py`: random
weights of the published architecture, rows that fill max_length, 4 steps, the defaults of the training type's
profile: batch 4, float32 master weights with bf16 autocast, compiled layers, padding-free rows; `lora`: DEFAULT_LORA;
`checkpointing`: activation_checkpointing), with the peak `torch.cuda.max_memory_allocated` it reached.
tests/memory/test_calibration.py predicts every row again from its settings and holds the prediction within
`TOLERANCE` of the measured peak. Fitted by least squares (non-negative) over the table.
"""

from __future__ import annotations

from dataclasses import dataclass

TOLERANCE = 0.15
MEASURED_ON = "NVIDIA H200, torch 2.11.0+cu130, transformers 5.24.0, trl 1.16.0, 2026-12-04"


@dataclass(frozen=True)
class Fit:
    layer_bytes: float  # kept for the backward, per token, layer and hidden unit (no checkpointing)
    lora_layer_bytes: float  # the same with LoRA (the frozen base's layers and the adapters' tensors)
    lora_dropout_layer_bytes: float  # what lora_dropout > 0 adds: each adapted layer's dropped input and its mask
    checkpoint_layer_bytes: float  # with checkpointing: each layer's input, per token and hidden unit
    checkpoint_extra_bytes: float  # and the one layer recomputed at a time, per token and hidden unit
    logit_bytes: float  # per token and vocabulary entry (SFT: TRL's loss in chunks)
    other_bytes: float  # CUDA workspaces and the allocator's slack


# (bench/fit_memory.py: the largest relative error over MEASURED minimised; 10.2% over its 28 rows. With QLoRA's
# checkpointed rows in the table, the recomputed layer and the CUDA workspaces fit to ~0: at the backward's peak the
# one recomputed layer's tensors and the workspaces sit inside what the per-layer and logit terms already count)
FIT = Fit(
    layer_bytes=48.68,
    lora_layer_bytes=43.47,
    lora_dropout_layer_bytes=12.36,
    checkpoint_layer_bytes=2.50,
    checkpoint_extra_bytes=0.14,
    logit_bytes=3.17,
    other_bytes=0.0003 * 2**30,
)


@dataclass(frozen=True)
class VisionFit:
    """LFM2-VL's vision encoder (memory/estimate.py `_with_vision`): per patch it runs over, vision layer and vision
    hidden unit."""

    layer_bytes: float  # kept for the backward (no checkpointing); also the one layer recomputed with checkpointing
    checkpoint_layer_bytes: float  # with checkpointing: each layer's input


# Fitted on two rows only (MEASURED_PICTURES: one without checkpointing, one with): the least constants that predict
# them are 58.5 and 3.3 (with the recomputed layer at 58.5); rounded up to 62 and 4 (a float32 layer input: the
# residual stream under bf16 autocast), which puts each row 1.5-3% over its measured peak - two rows show no spread to
# fit to, and the plan errs toward fitting. The language model's part of those rows uses FIT as it is.
VISION_FIT = VisionFit(layer_bytes=62.0, checkpoint_layer_bytes=4.0)

# max_length: the rows' length (every row fills it); the micro-batch is the profile's 4 rows (DPO: 4 pairs);
# settings: training_config keys the row ran with beyond the profile's
_BF16 = {"model_init_kwargs": {"dtype": "bfloat16"}}
_HALVED = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2}
_HALVED_BF16 = {**_BF16, **_HALVED}
# LoRA and QLoRA rows: lora_dropout 0.05 (DEFAULT_LORA's until 2026-12-07) unless the row gives its own
MEASURED: list[dict] = [
    {"model": "LFM2-1.2B", "method": "sft", "mode": "full", "max_length": 1024, "measured_gib": 22.17},
    {"model": "LFM2-1.2B", "method": "sft", "mode": "lora", "max_length": 1024, "measured_gib": 14.19},
    {"model": "LFM2-1.2B", "method": "sft", "mode": "full", "max_length": 2048, "measured_gib": 28.33},
    {"model": "LFM2-1.2B", "method": "sft", "mode": "lora", "max_length": 2048, "measured_gib": 21.45},
    {"model": "LFM2-1.2B", "method": "sft", "mode": "checkpointing", "max_length": 2048, "measured_gib": 18.53},
    {"model": "LFM2-350M", "method": "sft", "mode": "full", "max_length": 1024, "measured_gib": 8.44},
    {"model": "LFM2-350M", "method": "sft", "mode": "lora", "max_length": 1024, "measured_gib": 6.21},
    {"model": "LFM2-350M", "method": "sft", "mode": "full", "max_length": 2048, "measured_gib": 11.72},
    {"model": "LFM2-350M", "method": "sft", "mode": "lora", "max_length": 2048, "measured_gib": 10.09},
    {"model": "LFM2-2.6B", "method": "sft", "mode": "full", "max_length": 1024, "measured_gib": 47.56},
    {"model": "LFM2-2.6B", "method": "sft", "mode": "lora", "max_length": 1024, "measured_gib": 30.28},
    {"model": "LFM2-2.6B", "method": "sft", "mode": "full", "max_length": 2048, "measured_gib": 60.85},
    {"model": "LFM2-2.6B", "method": "sft", "mode": "lora", "max_length": 2048, "measured_gib": 45.65},
    # what the planner chose for a 16 GiB card (bench/memory.py --budgets 16): bf16 weights, then checkpointing
    {
        "model": "LFM2-1.2B",
        "method": "sft",
        "mode": "full",
        "max_length": 2048,
        "settings": {"optimizer_precision": "bf16_kahan", "activation_checkpointing": True},
        "measured_gib": 11.90,
    },
    {
        "model": "LFM2-2.6B",
        "method": "sft",
        "mode": "lora",
        "max_length": 2048,
        "settings": {"model_init_kwargs": {"dtype": "bfloat16"}, "activation_checkpointing": True},
        "measured_gib": 8.33,
    },
    {"model": "LFM2-1.2B", "method": "dpo", "mode": "full", "max_length": 1024, "measured_gib": 32.76},
    {"model": "LFM2-1.2B", "method": "dpo", "mode": "lora", "max_length": 1024, "measured_gib": 18.48},
    # QLoRA (DEFAULT_QLORA: nf4 through bitsandbytes 0.50.2), 2026-12-04; compile_layers false: no compiled layers
    {"model": "LFM2-350M", "method": "sft", "mode": "qlora", "max_length": 2048, "measured_gib": 8.07},
    {"model": "LFM2-1.2B", "method": "sft", "mode": "qlora", "max_length": 2048, "measured_gib": 15.21},
    {
        "model": "LFM2-1.2B",
        "method": "sft",
        "mode": "qlora",
        "max_length": 2048,
        "settings": {"compile_layers": False},
        "measured_gib": 18.29,
    },
    {"model": "LFM2-2.6B", "method": "sft", "mode": "qlora", "max_length": 2048, "measured_gib": 31.87},
    # what the planner chose for a 16 GiB card with QLoRA (bench/memory.py --budgets 16 --modes qlora): checkpointing
    {
        "model": "LFM2-1.2B",
        "method": "sft",
        "mode": "qlora",
        "max_length": 2048,
        "settings": {"activation_checkpointing": True},
        "measured_gib": 2.80,
    },
    {
        "model": "LFM2-2.6B",
        "method": "sft",
        "mode": "qlora",
        "max_length": 2048,
        "settings": {"activation_checkpointing": True},
        "measured_gib": 4.18,
    },
    # one H100 80GB, 2026-12-07 (bench/memory.py --budgets 24 / 16 --modes lora,qlora,lora-nodropout,...): what the
    # planner chose for those cards (bf16 base; at 16 GiB 2 rows x 2 accumulation), with and without lora_dropout
    {
        "model": "LFM2-1.2B",
        "method": "sft",
        "mode": "lora",
        "max_length": 2048,
        "settings": _BF16,
        "measured_gib": 16.71,
    },
    {
        "model": "LFM2-1.2B",
        "method": "sft",
        "mode": "lora",
        "max_length": 2048,
        "settings": _BF16,
        "lora_dropout": 0.0,
        "measured_gib": 13.79,
    },
    {
        "model": "LFM2-1.2B",
        "method": "sft",
        "mode": "qlora",
        "max_length": 2048,
        "lora_dropout": 0.0,
        "measured_gib": 12.09,
    },
    {
        "model": "LFM2-1.2B",
        "method": "sft",
        "mode": "lora",
        "max_length": 2048,
        "settings": _HALVED_BF16,
        "measured_gib": 9.63,
    },
    {
        "model": "LFM2-1.2B",
        "method": "sft",
        "mode": "qlora",
        "max_length": 2048,
        "settings": _HALVED,
        "measured_gib": 8.10,
    },
]

# GRPO on pictures (bench/vl_grpo.py through `leap-finetune run`): LFM2-VL architectures with random weights and their
# processors, 8 prompts x 8 generations (per_device_train_batch_size 64), max_completion_length 256, one 512x512
# picture per prompt (one tile: 1,024 patches; 287 prompt tokens with its 256 image tokens), the GRPO profile's
# defaults (float32 master weights, bf16 autocast, the vision encoder trained), leap-finetune's sampler; `settings`:
# what the plan chose for the GPU's free memory. tests/memory/test_vision_memory.py predicts them again.
MEASURED_PICTURES: list[dict] = [
    {
        "model": "LFM2-VL-450M",
        "method": "grpo",
        "mode": "full",
        "picture": (512, 512),
        "device": "NVIDIA H100 80GB HBM3",
        "date": "2026-12-06",
        "measured_gib": 70.27,
    },
    {
        "model": "LFM2-VL-1.6B",
        "method": "grpo",
        "mode": "full",
        "picture": (512, 512),
        "settings": {"activation_checkpointing": True},
        "device": "NVIDIA H100 80GB HBM3",
        "date": "2026-12-06",
        "measured_gib": 40.60,
    },
]
