"""What the user can fix when training or saving fails, said as such instead of a library's traceback: a full disk,
running out of memory, the run folder deleted under the run - each with what to do next (resume from the last
complete checkpoint, or run again)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "DefaultCPUAllocator", "OutOfMemoryError")


@contextmanager
def disk_errors(run_dir: Path, trainer=None, training: dict | None = None):
    """What the user can fix when training or saving fails, said as such instead of a library's traceback: a
    full disk (or quota) - where, and that the complete checkpoints are intact (a checkpoint half-written when
    the disk filled up has no marker) -, running out of memory - which settings to change -, and the run folder
    deleted under the run."""
    from leap_finetune.errors import LeapError
    from leap_finetune.files import is_disk_full

    try:
        yield
    except (KeyboardInterrupt, LeapError):
        raise
    except BaseException as err:
        step = f" at step {trainer.state.global_step}" if trainer is not None and trainer.state is not None else ""
        kept = saved_so_far(run_dir)
        if isinstance(err, (OSError, RuntimeError)) and not run_dir.is_dir():
            raise LeapError(
                f"the run folder was deleted while the run was training ({step.strip() or 'at its end'}): "
                "nothing more can be saved",
                where=str(run_dir),
                fix="start the run again (nothing of it is left to resume)",
            ) from None
        if is_disk_full(err):
            raise LeapError(
                f"the disk is full{step}: writing the run folder failed ({type(err).__name__})",
                where=str(run_dir),
                fix=f"free space on that disk (checkpoints: save_total_limit keeps fewer), then {kept}",
            ) from None
        if (
            isinstance(err, MemoryError)
            or isinstance(err, RuntimeError)
            and any(word in str(err) or word == type(err).__name__ for word in OUT_OF_MEMORY)
        ):
            raise _out_of_memory(err, step, training or {}, kept) from None
        raise


def _out_of_memory(err: BaseException, step: str, t: dict, kept: str):
    """The settings that decide the memory a step takes, as the run has them, and which way to turn each."""
    from leap_finetune.errors import LeapError

    colocated = bool(t.get("use_vllm")) and t.get("vllm_mode", "colocate") == "colocate"
    length = "max_completion_length" if "num_generations" in t else "max_length"  # (GRPO)
    batch = "batch_tokens" if t.get("batch_tokens") else "per_device_train_batch_size"
    keys = (batch, length, "gradient_checkpointing") + (("vllm_gpu_memory_utilization",) if colocated else ())
    settings = ", ".join(f"{k} {t[k]}" for k in keys if k in t)
    keep = "the tokens per step" if batch == "batch_tokens" else "the global batch"
    where = "GPU memory" if "CUDA" in str(err) or "cuda" in str(err) else "memory"
    if where == "GPU memory":  # (what it reached: docs/memory.md predicts the same quantity)
        from leap_finetune.recipes.summary import gpu_memory_summary

        peak = gpu_memory_summary().get("peak_gpu_memory_gib")
        settings += f"; {peak:.1f} GiB allocated at the peak" if peak is not None else ""
    # vLLM colocated holds its share of the GPU beside training (TRL's default 0.3: out of memory for full
    # fine-tuning of LFM2-1.2B at 64 completions on an H200, where 0.15 ran - bench/RESULTS.md)
    engine = (
        (
            "lower vllm_gpu_memory_utilization (the share of the GPU vLLM keeps beside training; 0.15 ran "
            "LFM2-1.2B at 64 completions on an H200) or set use_vllm: false (no engine memory), "
        )
        if colocated
        else ""
    )
    return LeapError(
        f"out of {where}{step} ({settings})",
        where="training_config",
        fix=f"{engine}lower {batch} (raise gradient_accumulation_steps to keep {keep}), lower {length}, "
        "set gradient_checkpointing: true, or train LoRA "
        f"(peft_config) - `leap-finetune plan CONFIG --gpu-memory N` predicts each and picks what fits a card of N "
        f"GiB (docs/memory.md); then {kept}",
    )


def saved_so_far(run_dir: Path) -> str:
    """What to do after the fix: resume from the last complete checkpoint, or run again when there is none."""
    from leap_finetune.runs.checkpoints import checkpoints, verify

    complete = [p for p in checkpoints(run_dir) if verify(p).ok] if run_dir.is_dir() else []
    if complete:
        return (
            f"resume with training_config.resume_from_checkpoint: latest (the last complete checkpoint, "
            f"{complete[-1].name}, is intact; one cut short is never resumed from)"
        )
    return "run again (no checkpoint was saved yet: nothing to resume)"
