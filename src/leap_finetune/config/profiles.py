"""Built-in profiles that `extends:` inherits from.

A profile is the starting point; the user's keys override it. Without `extends`, the training
type's default profile applies (DEFAULT_SFT for sft). Values here are chosen for real LFM2 models
on a GPU; the CPU quickstart overrides what it needs in its own YAML.
"""

from __future__ import annotations

import copy

# What every training type shares; each profile adds or overrides its own keys.
_COMMON = {
    "num_train_epochs": 1,
    "per_device_train_batch_size": 4,
    "per_device_eval_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "lr_scheduler_type": "cosine",
    "max_length": 2048,
    # Small LFM2 models fit without activation checkpointing, and it costs ~20% speed.
    "activation_checkpointing": False,
    "logging_steps": 10,
    "save_strategy": "steps",
    "save_steps": 500,
    "save_total_limit": 3,
    "eval_steps": 100,
    "report_to": "none",
    "seed": 42,
    # Several workers (DDP): gradients are all-reduced in 200 MB buckets instead of torch's 25 MB; on 2 H200s
    # with LFM2-1.2B, 77.6k -> 86.8k tokens/s and less memory (bench/RESULTS.md). No effect on one process.
    "ddp_bucket_cap_mb": 200,
}

TRAINING_PROFILES: dict[str, dict] = {
    "DEFAULT_SFT": {
        **_COMMON,
        "learning_rate": 2e-5,
        "warmup_steps": 0.03,  # a float in [0, 1) is a ratio of the total steps
        "weight_decay": 0.0,
        "packing": False,
        # Each step's rows are a random draw, dealt so every worker gets about the same tokens (recipes/sampling.py).
        "train_sampling_strategy": "batch_rebalance",
        # leap-finetune keys (not TRL's): which tokens carry the loss.
        "loss_on": "assistant",
    },
    # distill: SFT's rows and masks, the teacher's distributions as the target (recipes/distill.py)
    "DEFAULT_DISTILL": {
        **_COMMON,
        "learning_rate": 2e-5,
        "warmup_steps": 0.03,
        "weight_decay": 0.0,
        "packing": False,
        "train_sampling_strategy": "batch_rebalance",
        "loss_on": "assistant",
    },
    "DEFAULT_DPO": {
        **_COMMON,
        "learning_rate": 5e-7,  # DPO moves a model far with small steps (TRL and the DPO paper use 5e-7 to 1e-6)
        "warmup_steps": 0.1,
        "beta": 0.1,
    },
    "DEFAULT_KTO": {
        **_COMMON,
        "per_device_train_batch_size": 8,  # KTO estimates its KL term from other rows of the batch: keep it > 1
        "per_device_eval_batch_size": 8,
        "learning_rate": 5e-7,
        "warmup_steps": 0.1,
        "beta": 0.1,
        "desirable_weight": 1.0,
        "undesirable_weight": 1.0,
    },
    "DEFAULT_GRPO": {
        **{k: v for k, v in _COMMON.items() if k != "max_length"},  # GRPO: max_completion_length
        "per_device_train_batch_size": 8,  # completions per device per step: num_generations must divide the batch
        "per_device_eval_batch_size": 8,
        "learning_rate": 1e-6,
        "warmup_steps": 0.0,
        "lr_scheduler_type": "constant",
        "beta": 0.0,  # TRL's default: no KL term, no reference model in memory
        "num_generations": 8,
        "max_completion_length": 256,
        "temperature": 1.0,
        "logging_steps": 1,
        "log_completions": False,
        # rollouts: vLLM inside each training worker (TRL's colocate mode); `server` starts `trl vllm-serve`
        # on grpo_rollout.server_gpus before the workers
        "use_vllm": True,
        "vllm_mode": "colocate",
        # use_vllm: false: leap-finetune's decoding loop (rl/sampler.py: a static cache, the step one CUDA graph
        # on a GPU; measured 4.7-6x vLLM colocate for LFM2 up to 1.2B on one H200); null: TRL's generate path
        "cache_implementation": "static",
    },
}

# SFT of a vision-language model (LFM2-VL) on rows with images: the language model and projector at the learning
# rate, the vision encoder at a tenth of it (it was trained on far more images than a fine-tuning set holds; the
# original LEAP-Finetune used the same 0.1x). Images make rows long: 256 tokens per 512x512 tile.
TRAINING_PROFILES["DEFAULT_VLM_SFT"] = {
    **TRAINING_PROFILES["DEFAULT_SFT"],
    "learning_rate": 2e-5,
    "max_length": 4096,
    "per_device_train_batch_size": 2,
    "per_device_eval_batch_size": 2,
    # (train_vision_encoder / train_projector / train_language_model: all true for a full fine-tune, the language
    # model's adapters only with LoRA; filled in by validate/vision.py, which knows whether LoRA is on)
    "vision_encoder_lr_multiplier": 0.1,
}

# embedding / colbert (sentence-transformers' trainer: no max_length; lengths are retrieval.*_max_length)
_RETRIEVAL = {
    **{k: v for k, v in _COMMON.items() if k != "max_length"},
    "per_device_train_batch_size": 32,  # in-batch negatives: the batch is the number of negatives per query
    "per_device_eval_batch_size": 32,
    "learning_rate": 5e-5,
    "warmup_steps": 0.1,
    "lr_scheduler_type": "linear",
    "batch_sampler": "no_duplicates",  # a text twice in a batch would be its own false negative
}
TRAINING_PROFILES["DEFAULT_EMBEDDING"] = dict(_RETRIEVAL)
TRAINING_PROFILES["DEFAULT_COLBERT"] = {**_RETRIEVAL, "learning_rate": 3e-5}

PEFT_PROFILES: dict[str, dict] = {
    "DEFAULT_LORA": {
        "use_peft": True,
        "r": 16,
        "lora_alpha": 32,
        # 0, as in peft's and Unsloth's defaults: dropout keeps a dropped copy of each adapted layer's input and
        # its mask (LFM2-1.2B, 4 rows x 2048 on an H100: 0.05 cost 2.9 GiB of 16.7 and 7% of the tokens/s; docs/memory.md)
        "lora_dropout": 0.0,
        "bias": "none",
        # LFM2: attention (q/k/v/out_proj), short convolution (in_proj/out_proj) and the SwiGLU MLP (w1/w2/w3).
        "target_modules": ["q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3"],
    },
}
# LoRA on a vision-language model: adapters on the language model's layers only (a regular expression over module
# names: SigLIP2's attention also has q/k/v/out_proj). The vision encoder and projector stay frozen unless
# training_config.train_vision_encoder / train_projector say otherwise (then they are trained in full and saved
# with the adapter).
PEFT_PROFILES["DEFAULT_VLM_LORA"] = {
    **PEFT_PROFILES["DEFAULT_LORA"],
    "target_modules": r".*language_model.*\.(q_proj|k_proj|v_proj|out_proj|in_proj|w1|w2|w3)",
}
# QLoRA: the same adapters over a base whose linear layers load in 4 bits (nf4, double quantization, bf16 compute;
# config/quantization.py): about a quarter of the base's memory, at some speed (docs/memory.md measures both).
PEFT_PROFILES["DEFAULT_QLORA"] = {**PEFT_PROFILES["DEFAULT_LORA"], "quantization": "nf4"}
PEFT_PROFILES["DEFAULT_VLM_QLORA"] = {**PEFT_PROFILES["DEFAULT_VLM_LORA"], "quantization": "nf4"}
# what `train_*` means with LoRA: the defaults of a vision-language LoRA run
VLM_LORA_TRAINS = {"train_vision_encoder": False, "train_projector": False, "train_language_model": True}


def training_profile(name: str) -> dict:
    return copy.deepcopy(TRAINING_PROFILES[name])


def peft_profile(name: str) -> dict:
    return copy.deepcopy(PEFT_PROFILES[name])
