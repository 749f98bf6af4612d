"""What a run's processes hold on a GPU beside a training step: GRPO's rollouts inside the training process (the
sampler's bf16 copy and static KV caches, or colocated vLLM's share) and the servers the driver starts (the rollout
server, a judge, the evaluation server of async_eval).

vLLM reserves `gpu_memory_utilization` of the GPU's whole memory at start (its weights, activations and KV cache
inside it), so its process's peak is that share of the card: the card's size is the budget (`--gpu-memory`,
`gpu_memory:`) or, on a GPU machine, what nvidia-smi reports. Without either, the share is named, not counted.
"""

from __future__ import annotations

import math

from leap_finetune.memory.calibration import FIT
from leap_finetune.memory.estimate import GIB, Memory
from leap_finetune.memory.shapes import ModelShape

VLLM_SHARE_STEP = 0.05  # the planner lowers colocated vLLM's share in these steps
VLLM_HEADROOM = GIB  # vLLM's own activations and CUDA graphs inside its share (measured ~0.5-1 GiB for LFM2 <= 2.6B)


def kv_bytes(shape: ModelShape, rows: int, length: int) -> float:
    """One bf16 cache for `rows` sequences of `length` tokens: keys and values of each attention layer, the short
    convolutions' state of the others (their state does not grow with the length)."""
    per_token = 2 * shape.attention_layers * shape.kv_width * 2
    per_row = (shape.layers - shape.attention_layers) * shape.conv_width * 2
    return rows * (length * per_token + per_row)


def generation_rows(training: dict) -> int:
    """Completions one training process generates at once: per_device_train_batch_size x steps_per_generation
    (TRL's default: gradient_accumulation_steps)."""
    per_generation = training.get("steps_per_generation") or training.get("gradient_accumulation_steps") or 1
    return int(training.get("per_device_train_batch_size", 8)) * int(per_generation)


def rollout_length(training: dict, longest: int | None) -> int:
    prompt = training.get("max_prompt_length") or longest or 512
    return int(prompt) + int(training.get("max_completion_length", 256))


def rollout_cache(resolved, shape: ModelShape, longest: int | None, gpu_bytes: int | None) -> tuple[float, str]:
    """(bytes GRPO's rollouts hold in the training process, a note when part of it cannot be counted)."""
    from leap_finetune.methods import method_of

    t = resolved.training
    distill = getattr(resolved, "distill", None)
    if distill and distill.get("mode") == "on_policy":
        return on_policy_cache(resolved, shape, longest), ""
    if not method_of(resolved).rewards:
        return 0.0, ""
    if t.get("use_vllm"):
        if t.get("vllm_mode", "colocate") != "colocate":
            return 0.0, ""  # (the rollout server is a process of its own)
        share = float(t.get("vllm_gpu_memory_utilization", 0.3))
        if gpu_bytes is None:
            return 0.0, f"plus colocated vLLM's {share} of the GPU's memory (give --gpu-memory to count it)"
        return share * gpu_bytes, ""
    from leap_finetune.rl.sampler import CACHES_KEPT, LENGTH_BUCKET, why_not_config

    rows = generation_rows(t)
    init = t.get("model_init_kwargs") or {}
    quantized = isinstance(init, dict) and bool(init.get("quantization_config"))
    if why_not_config(t, vision=resolved.vision) is None:  # leap-finetune's sampler (rl/sampler.py)
        length = math.ceil(rollout_length(t, longest) / LENGTH_BUCKET) * LENGTH_BUCKET
        lora = shape.lora_parameters(resolved.peft) if resolved.peft else 0
        copy = 0 if quantized else 2 * (shape.parameters + lora)  # (the bf16 rollout copy: none of a 4-bit base)
        return copy + CACHES_KEPT * kv_bytes(shape, rows, length), ""
    return kv_bytes(shape, rows, rollout_length(t, longest)), ""  # transformers' generate: one cache per rollout


def on_policy_cache(resolved, shape: ModelShape, longest: int | None) -> float:
    """distill mode on_policy: the student's answers sampled on leap-finetune's sampler - its bf16 copy of the student
    and static caches for a micro-batch of prompts plus max_new_tokens (recipes/distill_on_policy.py)."""
    from leap_finetune.rl.sampler import CACHES_KEPT, LENGTH_BUCKET

    t = resolved.training
    rows = int(t.get("per_device_train_batch_size", 8))
    prompt = min(int(t.get("max_length") or 2048), longest or int(t.get("max_length") or 2048))
    length = math.ceil((prompt + int(resolved.distill.get("max_new_tokens", 256))) / LENGTH_BUCKET) * LENGTH_BUCKET
    lora = shape.lora_parameters(resolved.peft) if resolved.peft else 0
    return 2 * (shape.parameters + lora) + CACHES_KEPT * kv_bytes(shape, rows, length)


def smallest_vllm_share(resolved, shape: ModelShape, longest: int | None, gpu_bytes: int) -> float:
    """The share of the GPU colocated vLLM needs for the bf16 weights, one generation batch's KV cache and its
    headroom, rounded up to VLLM_SHARE_STEP: what the planner lowers vllm_gpu_memory_utilization to."""
    t = resolved.training
    needed = 2 * shape.parameters + kv_bytes(shape, generation_rows(t), rollout_length(t, longest)) + VLLM_HEADROOM
    return round(min(1.0, math.ceil(needed / gpu_bytes / VLLM_SHARE_STEP) * VLLM_SHARE_STEP), 2)


def vllm_server(shape: ModelShape | None, share: float, gpu_bytes: int | None) -> tuple[Memory | None, str]:
    """A vLLM server's process: its share of the card, the bf16 weights inside it, the rest its KV cache."""
    if gpu_bytes is None:
        return None, f"vLLM takes gpu_memory_utilization {share} of the GPU's memory (give --gpu-memory to count it)"
    total = share * gpu_bytes
    weights = min(total, 2 * shape.parameters) if shape is not None else 0.0
    note = "" if shape is not None else "the model's config.json is not at hand: its weights are inside the share"
    return Memory(weights, 0.0, 0.0, 0.0, 0.0, cache=total - weights), note


def transformers_server(shape: ModelShape | None) -> tuple[Memory | None, str]:
    """`transformers serve` on a GPU: the bf16 weights, CUDA's workspaces; one request's cache at a time."""
    if shape is None:
        return None, "the model's config.json is not at hand (plan downloads nothing)"
    return Memory(2 * shape.parameters, 0.0, 0.0, 0.0, FIT.other_bytes, cache=kv_bytes(shape, 1, 4096)), ""
