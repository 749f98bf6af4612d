"""The run's facts, worked out once: the micro-batch, the global batch, the steps, the precision and the devices.

`plan` (reports/show.py), the lines the run prints as it starts (`run:`, `devices:`, `device:`: reports/report.py)
and the model card (reports/model_card.py) all read them from here, so they cannot tell a user different things.
The steps themselves are counted by launch/steps.py, the way the trainer counts them (TRL's default batch,
`TRL_BATCH_SIZE`, is named there: the counting needs it first).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from leap_finetune.launch.steps import EpochSteps, accumulation, per_device_rows, prepared_steps


@dataclass(frozen=True)
class RunFacts:
    micro_batch: int | str  # rows per device, or "<= N tokens" (batch_tokens: as many rows as fit)
    accumulation: int  # gradient_accumulation_steps
    workers: int  # training processes
    # the global batch (`per_step`: rows, or GRPO's completions; the mean number of rows with batch_tokens: see
    # `approximate`, and its `unit`), the steps of an epoch, what happens to the epoch's last rows
    epoch: EpochSteps
    max_steps: int  # training_config's (-1: none)
    total_steps: int  # max_steps, else the epochs' steps
    total_is_bound: bool  # packing merges rows: the run takes at most total_steps
    device: str  # "cpu" | "gpu" | "mps" (an Apple Silicon GPU): where the trainer runs
    precision: str  # "bf16 mixed precision (chosen automatically)", "float32 (set in training_config)", ...
    devices: str  # the devices line as the run prints it at its start (gradient_communication said)
    hardware: str  # the devices line without training_config's notes (the model card adds how DDP all-reduced)
    # the predicted peak GPU memory of each training process, in bytes (memory/: set at the run's start by
    # memory/budget.fit_run; None on a CPU or without the model's config)
    peak_memory_per_process: float | None = None

    @property
    def global_batch(self) -> str:
        """`4 rows`, `~6 rows` (batch_tokens: a mean), `16 completions` (GRPO)."""
        return f"{'~' if self.epoch.approximate else ''}{self.epoch.per_step} {self.epoch.unit}"


def micro_batch(training: dict) -> int | str:
    """A micro-batch of each device: rows, or `<= N tokens` with batch_tokens."""
    if training.get("batch_tokens"):
        return f"<= {training['batch_tokens']} tokens"
    return per_device_rows(training)


def run_facts(resolved, prepared, devices) -> RunFacts:
    """The facts of a run of `resolved` on the device plan `devices` over the prepared training rows."""
    t = resolved.training
    epoch = prepared_steps(resolved, prepared, devices)
    max_steps = t.get("max_steps", -1)
    device, precision = precision_of(resolved, devices, has_eval=bool(prepared.eval))
    return RunFacts(
        micro_batch=micro_batch(t),
        accumulation=accumulation(t),
        workers=devices.workers,
        epoch=epoch,
        max_steps=max_steps,
        total_steps=epoch.total(t),
        total_is_bound=bool(t.get("packing")) and not (max_steps or 0) > 0,
        device=device,
        precision=precision,
        devices=devices_line(devices, t.get("gradient_communication"), mps=device == "mps"),
        hardware=devices_line(devices, mps=device == "mps"),
        peak_memory_per_process=resolved.predicted_gpu_memory,
    )


def precision_of(resolved, devices, has_eval: bool) -> tuple[str, str]:
    """("cpu" | "gpu", the precision and who chose it), from the trainer's arguments as the recipe builds them on
    the plan's devices (the driver assumes bf16 on a GPU; the training process checks: recipes/common.py)."""
    from leap_finetune.config.precision import keeps_bf16_weights
    from leap_finetune.recipes import recipe

    args = recipe(resolved.training_type).training_arguments(
        resolved, run_dir=os.devnull, has_eval=has_eval, cuda=devices.use_gpu
    )
    precision = (
        "bf16 mixed precision" if args.get("bf16") else "fp16 mixed precision" if args.get("fp16") else "float32"
    )
    chosen = (
        "set in training_config"
        if {"bf16", "fp16"} & set(resolved.training)
        else "chosen automatically" + ("; float32 on a GPU without bf16" if devices.use_gpu else "")
    )
    optimizer_precision = resolved.training.get("optimizer_precision")
    if keeps_bf16_weights(optimizer_precision):  # (recipes/optimizers.py: the weights themselves are bf16)
        precision = (
            f"bf16 weights, torch-optimi AdamW with Kahan summation (optimizer_precision: {optimizer_precision})"
        )
    device = "cpu" if args.get("use_cpu") else "gpu" if devices.use_gpu else "mps"
    return device, f"{precision} ({chosen})"


def devices_line(devices, gradient_communication: str | None = None, mps: bool = False) -> str:
    """`gradient_communication`: training_config's key (config/communication.py), said where it applies. `mps`:
    the training process trains on an Apple Silicon GPU (no CUDA)."""
    from leap_finetune.config.communication import ONE_PROCESS

    bf16 = gradient_communication == "bf16"
    if devices.in_process:
        where = f"1 GPU (device {devices.training[0]})" if devices.use_gpu else "Apple GPU (mps)" if mps else "CPU"
        return (
            f"devices: {where}, "
            + ("one training process (it sees only this GPU)" if devices.own_process else "in-process")
            + (f"; {ONE_PROCESS}" if bf16 else "")
        )
    kind = f"{len(devices.training)} GPU(s) per node: {devices.training}" if devices.use_gpu else "CPU workers"
    cluster = f"the Ray cluster at {devices.address}" if devices.address else "a local Ray instance"
    return (
        f"devices: {devices.workers} Ray Train workers ({devices.backend}) on {devices.nodes} node(s), {kind}; "
        f"{cluster}" + ("; gradients all-reduced in bf16 (gradient_communication)" if bf16 else "")
    )
