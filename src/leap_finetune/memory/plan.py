"""The memory of a run's GPU processes, predicted from the resolved config and the model's shape (no weights
loaded): what `plan` prints per process, what the run's start and its report compare with the measured peak, and
what memory/budget.py fits to a budget.
"""

from __future__ import annotations

from dataclasses import replace

from leap_finetune.memory.estimate import NF4_BYTES, Memory, Setup, training_memory
from leap_finetune.memory.pictures import RowTiles, row_tiles
from leap_finetune.memory.shapes import ModelShape, model_shape
from leap_finetune.methods import method_of

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}  # ("auto": LiquidAI ships bf16 weights)


def predicted_for(resolved) -> bool:
    """Which runs the estimate covers: the chat-model types (not the retrieval encoders yet)."""
    return method_of(resolved).encoder_class is None


def shape_of(resolved) -> ModelShape | None:
    """The model's shape, kept per model (plan asks once per process)."""
    if resolved.model_id not in _shapes:
        _shapes[resolved.model_id] = model_shape(resolved.model_id)
    return _shapes[resolved.model_id]


_shapes: dict[str, ModelShape | None] = {}


def setup_of(resolved, shape: ModelShape, longest: int | None = None, tiles: RowTiles | None = None) -> Setup:
    """The settings that decide memory, as the run will have them. `longest`: the longest prepared row in tokens
    (None: max_length bounds it); `tiles`: a vision-language run's pictures per row (memory/pictures.py; None: from
    the image processor's settings, one picture per row)."""
    t = resolved.training
    method = method_of(resolved)
    rows, per_row = _batch(t, method, longest)
    if tiles is None:
        tiles = row_tiles(resolved)
    init = t.get("model_init_kwargs") or {}
    quantized = (init.get("quantization_config") or {}) if isinstance(init, dict) else {}
    weight_bytes = (
        NF4_BYTES
        if quantized.get("load_in_4bit")
        else 1
        if quantized.get("load_in_8bit")
        else DTYPE_BYTES.get(str(init.get("dtype", "float32")), 4)
    )
    if str(t.get("optimizer_precision") or "").startswith("bf16") and not quantized:
        weight_bytes = 2
    completions = t.get("max_completion_length", 0) if method.rewards else 0
    return Setup(
        tokens=rows * per_row,
        logit_tokens=rows * (completions or per_row),
        weight_bytes=weight_bytes,
        lora_parameters=shape.lora_parameters(resolved.peft) if resolved.peft else 0,
        lora_dropout=bool(resolved.peft and resolved.peft.get("lora_dropout")),
        optim=str(t.get("optim", "adamw_torch_fused")),
        optimizer_precision=t.get("optimizer_precision"),
        checkpointing=bool(t.get("activation_checkpointing") or t.get("gradient_checkpointing")),
        reference=_reference(resolved, method),
        pairs=method.family == "preference",
        frozen_vision=resolved.vision and not t.get("train_vision_encoder", True),
        qat=bool(resolved.qat),
        teacher_bytes=teacher_bytes(resolved),
        vision_patches=tiles.patches_in(rows, _batch_tokens(t, method)) if tiles else 0,
        vision_trained=bool(tiles) and _vision_trained(resolved, shape),
    )


def _batch_tokens(t: dict, method) -> int | None:
    return int(t["batch_tokens"]) if t.get("batch_tokens") and not method.rewards else None


def _vision_trained(resolved, shape: ModelShape) -> bool:
    """Whether the backward reaches the vision encoder, so that its forward keeps its activations: trained in full,
    or LoRA on its layers (a regular expression of the user's may name them)."""
    if resolved.training.get("train_vision_encoder", True):
        return True
    return bool(resolved.peft) and any("vision_tower" in name for name in shape.lora_targets(resolved.peft))


def teacher_bytes(resolved) -> float:
    """distill: the teacher in bf16 beside the student (its activations are not kept: it runs without gradients;
    the loss's logits are a chunk of tokens at a time, recipes/distill_loss.py)."""
    if not resolved.distill or resolved.distill.get("teacher_gpus") or resolved.distill.get("teacher_base_url"):
        return 0  # (a served teacher takes no memory of the training GPU)
    teacher_id = resolved.distill["teacher_id"]
    if teacher_id not in _shapes:
        _shapes[teacher_id] = model_shape(teacher_id)
    shape = _shapes[teacher_id]
    return 2 * shape.parameters if shape is not None else 0


def _batch(t: dict, method, longest: int | None) -> tuple[int, int]:
    """(rows in the largest micro-batch, tokens per row): DPO's rows are pairs (chosen and rejected both run)."""
    if method.rewards:  # GRPO: completions per device, each its prompt and completion
        prompt = t.get("max_prompt_length") or longest or 512
        return int(t.get("per_device_train_batch_size", 8)), int(prompt) + int(t.get("max_completion_length", 256))
    length = int(t.get("max_length") or 2048)
    per_row = min(length, longest) if longest else length
    if t.get("batch_tokens"):
        return 1, int(t["batch_tokens"])
    rows = int(t.get("per_device_train_batch_size", 8))
    return rows * (2 if method.family == "preference" else 1), per_row  # (KTO: each row's KL row runs too)


def micro_batch_tokens(t: dict, method, longest: int | None) -> int:
    """Tokens of the largest micro-batch as the estimate counts them (rows x tokens per row, DPO's pairs twice)."""
    rows, per_row = _batch(t, method, longest)
    return rows * per_row


def _reference(resolved, method) -> bool:
    """A frozen second copy: DPO/KTO full fine-tunes (unless their log-probs are computed first), GRPO with a KL
    term; with LoRA the reference is the base with the adapter off, or (adapter_path) with a frozen copy of the
    adapter: no copy of the base."""
    t = resolved.training
    if resolved.peft or method.family not in ("preference", "reinforcement"):
        return False
    if method.rewards:
        return float(t.get("beta", 0.0) or 0.0) > 0
    return not t.get("precompute_ref_log_probs")


def predict(
    resolved, shape: ModelShape, longest: int | None = None, gpu_bytes: int | None = None, tiles: RowTiles | None = None
) -> Memory:
    """One training process's predicted peak: the training step's parts and what GRPO's rollouts hold beside it
    (memory/servers.py; colocated vLLM's share needs the card's size, `gpu_bytes`)."""
    from leap_finetune.memory.servers import rollout_cache

    cache, _ = rollout_cache(resolved, shape, longest, gpu_bytes)
    return replace(training_memory(shape, setup_of(resolved, shape, longest, tiles)), cache=cache)


def training_process_memory(resolved, longest: int | None = None) -> Memory | None:
    """One training process's predicted peak; None when the model's config is not at hand, or for an encoder
    (embedding, ColBERT: no measured constants yet - their own lengths and mini-batches, no vocabulary logits)."""
    if not predicted_for(resolved):
        return None
    shape = shape_of(resolved)
    if shape is None:
        return None
    return predict(resolved, shape, longest)


def longest_row(prepared) -> int | None:
    """The longest prepared training row in tokens (a prompt and its longest completion for preference rows; GRPO:
    the longest prompt, its images' tokens counted); None when the rows were counted without tokens."""
    if prepared is None or not getattr(prepared, "tokenized", False):
        return None
    import pyarrow.compute as pc

    table = prepared.train.table
    if table.num_rows == 0:
        return None

    def longest(column: str) -> int:
        if column not in table.column_names:
            return 0
        return int(pc.max(pc.list_value_length(table.column(column))).as_py() or 0)

    if "input_ids" in table.column_names:
        return longest("input_ids") or None
    if "prompt_text" in table.column_names:  # GRPO's prompts keep no token ids (TRL tokenizes them again): their
        return int(prepared.train.tokens_per_row.max()) or None  # counts (data/grpo_rows.py GrpoPrompt.tokens)
    # (preference rows: data/preference_tokens.py keeps prompt_ids and chosen_ids/rejected_ids, KTO completion_ids)
    completion = max(longest("chosen_ids"), longest("rejected_ids"), longest("completion_ids"))
    return (longest("prompt_ids") + completion) or None
