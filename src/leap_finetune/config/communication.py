"""`gradient_communication`: the precision in which data-parallel workers all-reduce their gradients.

DDP all-reduces float32 gradients by default: 4.7 GB per step for LFM2-1.2B, which on 2 H200s slowed the GEMMs
running beside it (bench/RESULTS.md). `bf16` registers torch's own `bf16_compress_hook` (through accelerate's
DDP kwargs): gradients are cast to bf16, all-reduced, averaged and cast back - half the bytes, each gradient
rounded to bf16 once per step (the optimizer still updates float32 weights). That rounding changes the
arithmetic, so it is opt-in (docs/speed.md). It does nothing for one process, and FSDP reduces in its own way."""

from __future__ import annotations

from leap_finetune.config.suggest import check_choice
from leap_finetune.errors import LeapError

KEY = "gradient_communication"
VALUES = {
    "fp32": "the default: gradients all-reduced in float32, exact",
    "bf16": "gradients cast to bf16 for the all-reduce, half the bytes between GPUs; opt-in, see docs/speed.md",
}
# said by validate and plan where one process trains
ONE_PROCESS = "gradient_communication: bf16 does nothing here (one process: no all-reduce)"
# what DDP reports as its communication hook (DistributedDataParallel._get_ddp_logging_data()["comm_hook"])
HOOK_NAMES = {"bf16_compress_hook": "bf16"}


def check_gradient_communication(training: dict, where: str) -> None:
    """A known value, and not with fsdp (whose sharded reduce-scatter has no DDP hook). The default written out
    (`fp32`) is dropped from `training`: a resume that adds or removes it changes nothing."""
    if KEY not in training:
        return
    value = training[KEY]
    check_choice(KEY, value, VALUES, where, " - or leave the key out for fp32")
    if value != "fp32" and training.get("fsdp"):
        raise LeapError(
            f"training_config.{KEY} is {value} and fsdp is set: the bf16 all-reduce is a DDP communication hook, and "
            "FSDP shards the gradients with its own reduce-scatter",
            where=where,
            fix=f"remove {KEY} (or fsdp, for a model that fits on each GPU)",
        )
    if value == "fp32":
        del training[KEY]


def bf16_weights(training: dict) -> bool:
    """Weights held in bf16 (optimizer_precision: bf16_kahan, or model_init_kwargs.dtype bf16): their gradients are
    bf16 already, and DDP all-reduces them as they are."""
    from leap_finetune.config.precision import init_dtype, keeps_bf16_weights

    bf16 = ("bfloat16", "bf16", "torch.bfloat16")
    return keeps_bf16_weights(training.get("optimizer_precision")) or init_dtype(training) in bf16


def planned_all_reduce(training: dict) -> str:
    """What `plan` says several DDP workers will all-reduce in."""
    if bf16_weights(training):
        return "bf16 (the weights are bf16)"
    return "bf16" if training.get(KEY) == "bf16" else "fp32"


def use_gradient_communication(trainer, value: str | None) -> None:
    """Before train(): accelerate registers the hook when it wraps the model in DDP (Accelerator.prepare_model),
    from the DDP kwargs the Trainer gave it. transformers' TrainingArguments has no key for the hook, so it is set
    on those kwargs here (accelerate's public DistributedDataParallelKwargs.comm_hook)."""
    if value in (None, "fp32"):
        return
    from accelerate.utils import DDPCommunicationHookType

    handler = trainer.accelerator.ddp_handler
    if handler is None:  # (transformers always passes DDP kwargs; a version that does not would skip the hook)
        raise RuntimeError("the Trainer's accelerator has no DDP settings to register the bf16 all-reduce on")
    handler.comm_hook = DDPCommunicationHookType.BF16


def gradient_all_reduce(trainer) -> str | None:
    """How the run's gradients were all-reduced, as DDP itself reports it: 'bf16', 'fp32', or 'bf16 (the weights
    are bf16)' where no hook was needed; None for one process or FSDP (no DDP wrapper)."""
    import torch

    wrapped = getattr(trainer, "model_wrapped", None)
    if not isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        return None
    # (DDP's own record of the hook it calls - the private accessor is the only one - so the report says what ran,
    # not what was asked for)
    hook = wrapped._get_ddp_logging_data().get("comm_hook") or ""
    if hook:
        return HOOK_NAMES.get(hook, hook)
    trained = next((p for p in wrapped.module.parameters() if p.requires_grad), None)
    return "bf16 (the weights are bf16)" if trained is not None and trained.dtype == torch.bfloat16 else "fp32"
