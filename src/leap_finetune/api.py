"""What the CLI and Python users call: load_config, validate_config, inspect_config, plan_config, slurm_config,
run_config, evaluate_config.

The driver decides everything (config, data, run folder, resume point, devices) before the worker starts: the
checks are launch/checks.py's, the run folder launch/run_folder.py's, the training launch/training.py's; user
mistakes surface as LeapError before anything is written to the output folder.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from leap_finetune import signals
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.data.prepared import PreparedData
from leap_finetune.evaluation.standalone import check_benchmarks, evaluate_config
from leap_finetune.launch.checks import check_run, check_training_arguments, prepare
from leap_finetune.launch.devices import device_plan, physical_ids, visible_gpus
from leap_finetune.launch.facts import devices_line
from leap_finetune.launch.reports.report import config_table, data_report, print_plan_notes
from leap_finetune.validate.grpo import check_generation_batch
from leap_finetune.validate.loader import load_config, require_dataset

__all__ = [
    "load_config",
    "validate_config",
    "inspect_config",
    "plan_config",
    "slurm_config",
    "run_config",
    "evaluate_config",
]


def _console(console: Console | None) -> Console:
    return console or Console(stderr=True)


def _config(source) -> ResolvedConfig:
    return source if isinstance(source, ResolvedConfig) else load_config(source)


def validate_config(
    source, *, console: Console | None = None, outputs_root: str | Path | None = None
) -> PreparedData | None:
    """Validate the config, EVERY dataset row (rendered and tokenized), every benchmark row and the
    run folder `run` would use (writable, not taken, the checkpoint to resume from); no model is
    loaded and nothing is written to the run folder (the prepared rows go to the data cache, for `run`).
    An evaluation-only config (no dataset) checks its benchmarks."""
    console = _console(console)
    resolved = _config(source)
    if resolved.dataset is None and resolved.evals is not None:  # an evaluation-only config
        from leap_finetune.evaluation.standalone import model_to_evaluate

        target = model_to_evaluate(resolved)  # the checkpoint: folder holds a model or an adapter
        benchmarks = check_benchmarks(resolved, target.model_id)
        console.print(f"model: {target.name}")
        console.print(f"benchmarks: {', '.join(f'{b.name} ({len(b.items)} rows)' for b in benchmarks)}")
        return None
    checked = check_run(resolved, console, outputs_root)
    plan, resolved = checked.plan, checked.resolved  # (a resume: the memory fit its run recorded, kept)
    from leap_finetune.memory.budget import fit_run  # (what run would refuse for memory, validate refuses too)

    devices = checked.devices
    gpu = physical_ids(devices.training[:1]) if devices.use_gpu else None
    resolved = fit_run(resolved, gpu, checked.prepared, console, resuming=not plan.new_run, planning=True)
    console.print(config_table(resolved))
    data_report(console, checked.prepared, resolved)
    from leap_finetune.launch.steps import prepared_steps

    steps = prepared_steps(resolved, checked.prepared, checked.devices)
    if steps.last_batch:  # (what run says of the last batch or of batch_tokens' grouping, said here too)
        console.print(steps.last_batch, markup=False)
    console.print(devices_line(checked.devices, resolved.training.get("gradient_communication")))
    console.print(
        f"run folder: {plan.run_dir}" + (f" (resuming from {plan.resume_checkpoint})" if plan.resume_checkpoint else "")
    )
    print_plan_notes(console, plan)
    return checked.prepared


def plan_config(source, *, gpus: int | None = None, nodes: int | None = None) -> dict:
    """What a run would do - devices, workers, batches, steps, every process with its command and
    CUDA_VISIBLE_DEVICES - without starting anything; `gpus` / `nodes` plan for another machine. The
    config and every row are validated first (steps per epoch need the data). The model is never loaded nor
    downloaded: token counts need its tokenizer, so without it here (not in the Hugging Face cache, a folder of
    another machine) the rows are checked and counted without tokens, and the plan says why."""
    from leap_finetune.data.prepare import count_rows
    from leap_finetune.launch.reports.show import plan_report
    from leap_finetune.models.loading import tokenizer_at_hand

    resolved = _config(source)
    require_dataset(resolved)
    tokenizer, no_tokens = tokenizer_at_hand(resolved.model_id, resolved.training.get("model_init_kwargs"))
    if tokenizer is not None:
        _, _, prepared = prepare(resolved, tokenizer=tokenizer)
    else:
        check_benchmarks(resolved)
        prepared = count_rows(resolved)
    # (checked as this machine would build them, as before: TRL refuses bf16 where no GPU is)
    check_training_arguments(resolved, has_eval=bool(prepared.eval), cuda=visible_gpus() > 0)
    devices = device_plan(resolved, gpus=gpus, nodes=nodes)
    check_generation_batch(resolved, devices.workers)  # vLLM need not be installed to plan
    return plan_report(resolved, devices, prepared, no_tokens=no_tokens)


def slurm_config(
    source,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    submit: bool = False,
    console: Console | None = None,
) -> dict:
    """Write the sbatch script that runs this config on a SLURM allocation (Ray brought up over it);
    checked by `sbatch --test-only` where sbatch exists; submitted with `submit`. The config and every
    row are validated first, and the device plan for the allocation."""
    from leap_finetune.config.schema_cluster import SlurmConfig
    from leap_finetune.launch.devices import plan_devices
    from leap_finetune.launch.plan import outputs_folder
    from leap_finetune.launch.slurm import (
        check_job_resources,
        check_with_sbatch,
        write_script,
    )
    from leap_finetune.launch.slurm import submit as submit_job

    console = _console(console)
    resolved = _config(source)
    slurm = (resolved.slurm or SlurmConfig()).model_copy(
        update={k: v for k, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node)) if v is not None}
    )
    _, _, prepared = prepare(resolved)
    check_training_arguments(resolved, has_eval=bool(prepared.eval), cuda=visible_gpus() > 0)
    where = resolved.config_path or "config"
    devices = plan_devices(
        gpus=slurm.gpus_per_node,
        nodes=slurm.nodes,
        num_workers=resolved.ray.num_workers if resolved.ray else None,
        fsdp=bool(resolved.training.get("fsdp")),
        where=where,
    )
    check_job_resources(resolved, devices, where)
    script = write_script(resolved, slurm, outputs_folder(resolved) / "slurm")
    report = {"script": str(script), "log": str(script.parent / "slurm-<job id>.out")}
    if submit:
        check_with_sbatch(script)
        job = submit_job(script)
        log = script.parent / f"slurm-{job}.out"
        report.update(job_id=job, log=str(log))
        console.print(f"submitted job {job}; follow it with: tail -f {log}   (squeue -j {job})")
    else:
        import shutil

        if shutil.which("sbatch"):
            check_with_sbatch(script)
            console.print(f"wrote {script} (sbatch --test-only accepts it); submit with: sbatch {script}")
        else:
            console.print(f"wrote {script}; sbatch is not installed here: copy it to the cluster and run sbatch there")
    return report


def inspect_config(source, *, rows: int = 5) -> list[dict]:
    """The first `rows` training rows exactly as the model sees them, with the character spans
    whose tokens carry loss."""
    resolved = _config(source)
    _, _, prepared = prepare(resolved, examples=rows)
    return [{"row": index, **item} for index, item in enumerate(prepared.train.examples[:rows])]


def run_config(
    source, *, console: Console | None = None, callbacks: list | None = None, outputs_root: str | Path | None = None
) -> dict:
    """Validate, plan and train. Returns the run summary (run folder, losses, model folder)."""
    from leap_finetune.launch.train_log import TrainLog

    # Ctrl-C / SIGTERM: at once before training, a checkpoint while training, the end finished after it
    with signals.handled(), TrainLog() as log:  # train.log in the run folder: what this prints, from here on
        return _run(source, console, callbacks, outputs_root, log)


def _claim_run_folder(resolved, prepared, renderer, plan):
    """The run folder written and locked. A new run named automatically (`sft-<date>-<time>`) whose folder another
    run took in the meantime - two runs started in the same second, a sweep's - takes the next free name (`-2`,
    `-3`...); a name the user chose is theirs to change, so that is the error it was."""
    from leap_finetune.errors import FolderTaken
    from leap_finetune.launch.run_folder import write_run_folder

    automatic = plan.new_run and not resolved.training.get("run_name") and not resolved.output_dir
    base, suffix = plan.run_name, 1
    while True:
        try:
            return resolved, write_run_folder(resolved, prepared, renderer, plan)
        except FolderTaken:
            if not automatic or suffix >= 50:
                raise
        while True:
            suffix += 1
            plan.run_dir = plan.run_dir.parent / f"{base}-{suffix}"
            if not plan.run_dir.exists():
                break
        plan.run_name = plan.run_dir.name
        resolved = resolved.model_copy(update={"run_dir": str(plan.run_dir), "run_name": plan.run_name})


def _run(source, console, callbacks, outputs_root, log) -> dict:
    from leap_finetune.launch.rl_servers import judge_url, local_servers
    from leap_finetune.launch.training import train_run

    console = _console(console)
    resolved = _config(source)
    if resolved.dataset is None and resolved.evals is not None:  # an evaluation-only config
        return evaluate_config(resolved, console=console)
    checked = check_run(resolved, console, outputs_root)
    prepared, plan, devices = checked.prepared, checked.plan, checked.devices
    resolved = checked.resolved  # (a resume: the memory fit its run recorded, kept)
    if callbacks and (not devices.in_process or devices.own_process):
        raise ValueError(
            "run_config(callbacks=...) needs an in-process run (one device, the machine's only GPU or "
            f"the CPU); this plan has {devices.workers} worker(s) on GPU(s) {devices.training} of "
            f"{devices.gpus_per_node}: make one GPU visible (CUDA_VISIBLE_DEVICES=N) or drop callbacks"
        )
    from leap_finetune.memory.budget import fit_run

    gpu = physical_ids(devices.training[:1]) if devices.use_gpu else None
    resolved = fit_run(resolved, gpu, prepared, console, resuming=not plan.new_run)
    console.print(config_table(resolved))
    data_report(console, prepared, resolved)
    print_plan_notes(console, plan)
    if plan.finished is not None:
        return {**plan.finished, "run_dir": str(plan.run_dir), "already_finished": True}
    resolved = resolved.model_copy(
        update={
            "run_dir": str(plan.run_dir),
            "run_name": plan.run_name,
            "workers": devices.workers,
            "resume_checkpoint_path": str(plan.resume_checkpoint) if plan.resume_checkpoint else None,
            "resume_changes": {k: list(v) for k, v in plan.changes.items()},
            "eval_devices": physical_ids(devices.eval),  # the reserved evaluation server's ("" without GPUs)
        }
    )
    from leap_finetune.launch.teacher_server import teacher_servers, teacher_url

    # GRPO's rollout server and judge, distillation's teacher server: started before training
    servers = local_servers(resolved, devices) + teacher_servers(resolved, devices)
    resolved = resolved.model_copy(update={"judge_url": judge_url(resolved)})
    if resolved.distill:
        resolved = resolved.model_copy(
            update={"distill": {**resolved.distill, "server_url": teacher_url(resolved, devices)}}
        )
    resolved, lock = _claim_run_folder(resolved, prepared, checked.renderer, plan)  # (this run's alone from here)
    try:
        return train_run(resolved, prepared, plan, devices, servers, lock, console, callbacks, log)
    finally:
        lock.release()
