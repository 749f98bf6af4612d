"""The final model saved at the end of a run: loadable with from_pretrained (merged for LoRA, the adapter beside
it), with its processor for a vision-language model, each folder written whole (runs/atomic.py). With FSDP the
whole model is gathered on rank 0 first."""

from __future__ import annotations

from pathlib import Path

from leap_finetune import faults
from leap_finetune.config.quantization import is_quantized
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.runs.folder import RunFolder


def save_final_model(trainer, resolved: ResolvedConfig, run_dir: Path, tokenizer, console):
    """model/ (and adapter/ for LoRA) from the trainer's model: (the model saved, the summary's entries naming the
    folders). Rank 0 only; the other ranks take part in gathering the weights (full_state_dict)."""
    final_model = trainer.model
    state_dict = full_state_dict(trainer)
    saved = {}
    if resolved.peft is not None:
        save_atomic(
            RunFolder(run_dir).adapter,
            lambda path: (final_model.save_pretrained(path, state_dict=state_dict), tokenizer.save_pretrained(path)),
        )
        quantized = is_quantized(resolved.training.get("model_init_kwargs"))
        final_model = (
            _merged_from_adapter(resolved, tokenizer, RunFolder(run_dir).adapter)
            if state_dict is not None or quantized
            else final_model.merge_and_unload()
        )
        saved["adapter_dir"] = str(RunFolder(run_dir).adapter)
        state_dict = None
    saver = _processing_saver(resolved, tokenizer, console)
    save_atomic(
        RunFolder(run_dir).model,
        lambda path: (final_model.save_pretrained(path, state_dict=state_dict), saver.save_pretrained(path)),
    )
    saved["model_dir"] = str(RunFolder(run_dir).model)
    if resolved.peft is not None and is_quantized(resolved.training.get("model_init_kwargs")):
        # (QLoRA: the samples come from the model the benchmarks measured - the quantized base with its adapter, on
        # the GPU - not from the merged copy on the CPU)
        return trainer.model, saved
    return final_model, saved


def full_state_dict(trainer) -> dict | None:
    """FSDP: the whole model's weights gathered on rank 0 (on the CPU); a collective, so every rank calls
    it at the same point. Without FSDP: None (the model in memory is whole)."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return None
    return trainer.accelerator.get_state_dict(trainer.model)


def _merged_from_adapter(resolved: ResolvedConfig, tokenizer, adapter_dir: Path):
    """FSDP + LoRA: the sharded model cannot merge in place; QLoRA: merging into 4-bit weights would round the merged
    model to 4 bits. The base model is loaded on the CPU (QLoRA's unquantized, in the dtype its other weights trained
    in) and the saved adapter merged into it."""
    import torch
    from peft import PeftModel

    from leap_finetune.models.loading import load_model

    init = dict(resolved.training.get("model_init_kwargs") or {})
    dtype = init.pop("dtype", None) if is_quantized(init) else None
    init.pop("dtype", None)
    init.pop("quantization_config", None)
    base = load_model(resolved.model_id, tokenizer, init, dtype=dtype or torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()


def _processing_saver(resolved: ResolvedConfig, tokenizer, console):
    """A vision-language model is saved with its processor (image settings + tokenizer), so that the
    folder loads with AutoProcessor; without torchvision only the tokenizer can be saved."""
    from leap_finetune.errors import LeapError
    from leap_finetune.models.vision import is_vision_model, load_processor

    if not is_vision_model(resolved.model_id):
        return tokenizer
    settings = resolved.image_processor.settings() if resolved.image_processor is not None else None
    try:
        return load_processor(resolved.model_id, tokenizer, settings)
    except LeapError as err:
        console.print(f"note: the model is saved without its image processor ({err.message})")
        return tokenizer


def save_atomic(target: Path, save) -> None:
    """Save into a staging folder that then takes the target's place whole (runs/atomic.py): a crash never leaves
    a half-written model, nor (as deleting first did) none."""
    from leap_finetune.runs.atomic import replace_folder

    replace_folder(target, lambda staging: save(str(staging)), before_swap=lambda: faults.point("final-save"))
