"""What the CLI and Python users call: load_config, validate_config, inspect_config, run_config.

The driver decides everything (config, data, run folder, resume point) before the worker starts;
user mistakes surface as LeapError before anything is written to the output folder.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from rich.console import Console

from leap_finetune import signals
from leap_finetune.config.grpo import check_generation_batch, check_rollout_engine
from leap_finetune.config.loader import load_config
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.yaml_io import dump_yaml
from leap_finetune.data.prepare import PreparedData, prepare_data
from leap_finetune.errors import LeapError
from leap_finetune.evaluation.standalone import check_benchmarks as _check_benchmarks
from leap_finetune.evaluation.standalone import evaluate_config
from leap_finetune.launch.devices import device_plan, physical_ids
from leap_finetune.launch.plan import (
    check_resume_matches,
    plan_run,
    record_changes,
    rewind,
)
from leap_finetune.launch.report import config_table, data_report
from leap_finetune.launch.rl_servers import judge_url, local_servers
from leap_finetune.launch.servers import running
from leap_finetune.launch.steps import epoch_steps
from leap_finetune.rl.custom_rewards import check_custom_rewards
from leap_finetune.rl.judge import check_judge_server
from leap_finetune.runs.folder import RunFolder

__all__ = ["load_config", "validate_config", "inspect_config", "plan_config", "slurm_config", "run_config",
           "evaluate_config"]


def _console(console: Console | None) -> Console:
    return console or Console(stderr=True)


def _check_async_eval(resolved: ResolvedConfig, devices) -> None:
    if resolved.async_eval is not None and resolved.async_eval.mode != "sync":
        from leap_finetune.evaluation.async_eval import check_async_eval

        check_async_eval(resolved, devices)


def _config(source) -> ResolvedConfig:
    return source if isinstance(source, ResolvedConfig) else load_config(source)


def _prepare(resolved: ResolvedConfig, console: Console | None = None, examples: int = 5, tokenizer=None):
    from leap_finetune.config.loader import require_dataset

    require_dataset(resolved)
    _check_benchmarks(resolved)
    from leap_finetune.data.chat_templates import load_chat_template
    from leap_finetune.data.render import Renderer
    from leap_finetune.models.loading import load_tokenizer

    init_kwargs = resolved.training.get("model_init_kwargs")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(resolved.model_id, init_kwargs)
    _check_lora_targets(resolved, tokenizer)
    if resolved.retrieval is not None:  # embedding / colbert: no chat template; prompts and lengths per side
        from leap_finetune.data.retrieval_tokens import RetrievalEncoder

        r = resolved.retrieval
        encoder = RetrievalEncoder(tokenizer, r.prompts, r.query_max_length, r.document_max_length)
        return tokenizer, encoder, prepare_data(resolved, tokenizer, encoder, console=console, examples=examples)
    template = load_chat_template(resolved.chat_template, tokenizer)
    # DPO / KTO split prompt from completion themselves and need no generation markers.
    loss_on = resolved.loss_on if resolved.training_type == "sft" else "all"  # (GRPO renders prompts only)
    renderer = Renderer(
        tokenizer, template, loss_on, resolved.training.get("max_length"),
        resolved.training.get("truncation_mode", "keep_start"),
    )
    return tokenizer, renderer, prepare_data(resolved, tokenizer, renderer, console=console, examples=examples)


def _check_lora_targets(resolved: ResolvedConfig, tokenizer) -> None:
    """LoRA's target_modules must name modules of this model (read from its config, no weights)."""
    if resolved.peft is None:
        return
    from leap_finetune.models.structure import check_lora_targets, module_names

    names = module_names(resolved.model_id, tokenizer, resolved.training.get("model_init_kwargs"),
                         head=resolved.retrieval is None)
    if names is not None:
        check_lora_targets(resolved.peft, names, resolved.model_id, resolved.config_path or "config")


def _check_training_arguments(resolved: ResolvedConfig, has_eval: bool) -> None:
    """Build the trainer's config once, so a bad value fails now, not after the model loads."""
    from leap_finetune.config.rules import check_trainer_parts
    from leap_finetune.recipes import recipe

    module = recipe(resolved.training_type)
    config_cls = module.config_class()
    where = resolved.config_path or "config"
    try:
        args = config_cls(**module.training_arguments(resolved, run_dir=os.devnull, has_eval=has_eval))
    except (ValueError, TypeError) as err:
        raise LeapError(f"a value is not valid for TRL's {config_cls.__name__}: {err}", where=f"{where}: training_config",
                        fix=f"see docs/config.md and TRL's {config_cls.__name__} documentation") from None
    check_trainer_parts(args, where)


def validate_config(source, *, console: Console | None = None,
                    outputs_root: str | Path | None = None) -> PreparedData | None:
    """Validate the config, EVERY dataset row (rendered and tokenized), every benchmark row and the
    run folder `run` would use (writable, not taken, the checkpoint to resume from); no model is
    loaded and nothing is written to the run folder (the prepared rows go to the data cache, for `run`).
    An evaluation-only config (no dataset) checks its benchmarks."""
    console = _console(console)
    resolved = _config(source)
    if resolved.dataset is None and resolved.evals is not None:  # an evaluation-only config
        from leap_finetune.evaluation.standalone import model_to_evaluate

        target = model_to_evaluate(resolved)  # the checkpoint: folder holds a model or an adapter
        benchmarks = _check_benchmarks(resolved, target.model_id)
        console.print(f"model: {target.name}")
        console.print(f"benchmarks: {', '.join(f'{b.name} ({len(b.items)} rows)' for b in benchmarks)}")
        return None
    tokenizer, _, prepared = _prepare(resolved, console)
    _check_training_arguments(resolved, has_eval=bool(prepared.eval))
    plan = plan_run(resolved, outputs_root=Path(outputs_root) if outputs_root else None)
    check_rollout_engine(resolved)  # vLLM installed where use_vllm says so (plan does not need it)
    check_judge_server(resolved, console)  # an external judge answers (and serves its model)
    if plan.finished is None:  # (a finished run trains nothing: the user's code is not run for it)
        check_custom_rewards(resolved, prepared, tokenizer, console)  # called once on the first rows
    devices = device_plan(resolved)
    check_generation_batch(resolved, devices.workers)
    epoch_steps(resolved, len(prepared.train), devices.workers)  # GRPO: prompts that fill no generation batch
    _check_async_eval(resolved, devices)
    plan.changes = check_resume_matches(resolved, plan, fingerprint(prepared), devices.workers)
    _check_run_folder_free(plan)
    console.print(config_table(resolved))
    data_report(console, prepared, resolved)
    console.print(devices_line(devices))
    console.print(f"run folder: {plan.run_dir}" + (f" (resuming from {plan.resume_checkpoint})" if plan.resume_checkpoint else ""))
    _print_plan_notes(console, plan)
    return prepared


def _check_run_folder_free(plan) -> None:
    """No live run holds the folder this run would use (checked again, for good, when the lock is taken)."""
    from leap_finetune.launch.run_lock import check_free

    if plan.run_dir.is_dir():
        check_free(plan.run_dir, "the run folder" if not plan.new_run else "output_dir")


def _print_plan_notes(console: Console, plan) -> None:
    for note in plan.notes:
        console.print(f"[yellow]warning: {note}[/yellow]")
    if plan.changes:
        from leap_finetune.recipes.checkpoints import step_of

        listed = "; ".join(f"{k.removeprefix('training_config.')}: {old!r} -> {new!r}" for k, (old, new) in plan.changes.items())
        console.print(f"resume: from step {step_of(plan.resume_checkpoint)} on, {listed} (resume_allow_changes; "
                      "recorded in resume_changes.json)")
    if plan.finished is not None:
        console.print(f"[green]already finished[/green]: {plan.run_dir} ended at step {plan.finished['global_step']} "
                      f"with these settings; nothing to train (model: {plan.finished['model_dir']}). To train "
                      "longer, raise max_steps or num_train_epochs; to start again, remove resume_from_checkpoint.")


def plan_config(source, *, gpus: int | None = None, nodes: int | None = None) -> dict:
    """What a run would do - devices, workers, batches, steps, every process with its command and
    CUDA_VISIBLE_DEVICES - without starting anything; `gpus` / `nodes` plan for another machine. The
    config and every row are validated first (steps per epoch need the data). The model is never loaded nor
    downloaded: token counts need its tokenizer, so without it here (not in the Hugging Face cache, a folder of
    another machine) the rows are checked and counted without tokens, and the plan says why."""
    from leap_finetune.config.loader import require_dataset
    from leap_finetune.data.prepare import count_rows
    from leap_finetune.launch.show import plan_report
    from leap_finetune.models.loading import tokenizer_at_hand

    resolved = _config(source)
    require_dataset(resolved)
    tokenizer, no_tokens = tokenizer_at_hand(resolved.model_id, resolved.training.get("model_init_kwargs"))
    if tokenizer is not None:
        _, _, prepared = _prepare(resolved, tokenizer=tokenizer)
    else:
        _check_benchmarks(resolved)
        prepared = count_rows(resolved)
    _check_training_arguments(resolved, has_eval=bool(prepared.eval))
    devices = device_plan(resolved, gpus=gpus, nodes=nodes)
    check_generation_batch(resolved, devices.workers)  # vLLM need not be installed to plan
    return plan_report(resolved, devices, prepared, no_tokens=no_tokens)


def slurm_config(source, *, nodes: int | None = None, gpus_per_node: int | None = None, submit: bool = False,
                 console: Console | None = None) -> dict:
    """Write the sbatch script that runs this config on a SLURM allocation (Ray brought up over it);
    checked by `sbatch --test-only` where sbatch exists; submitted with `submit`. The config and every
    row are validated first, and the device plan for the allocation."""
    from leap_finetune.config.schema import SlurmConfig
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
    slurm = (resolved.slurm or SlurmConfig()).model_copy(update={
        k: v for k, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node)) if v is not None})
    _, _, prepared = _prepare(resolved)
    _check_training_arguments(resolved, has_eval=bool(prepared.eval))
    where = resolved.config_path or "config"
    devices = plan_devices(gpus=slurm.gpus_per_node, nodes=slurm.nodes, num_workers=resolved.ray.num_workers
                           if resolved.ray else None, fsdp=bool(resolved.training.get("fsdp")), where=where)
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
    _, _, prepared = _prepare(resolved, examples=rows)
    return [{"row": index, **item} for index, item in enumerate(prepared.train.examples[:rows])]


def run_config(source, *, console: Console | None = None, callbacks: list | None = None,
               outputs_root: str | Path | None = None) -> dict:
    """Validate, plan and train. Returns the run summary (run folder, losses, model folder)."""
    from leap_finetune.launch.train_log import TrainLog

    # Ctrl-C / SIGTERM: at once before training, a checkpoint while training, the end finished after it
    with signals.handled(), TrainLog() as log:  # train.log in the run folder: what this prints, from here on
        return _run(source, console, callbacks, outputs_root, log)


def _run(source, console, callbacks, outputs_root, log) -> dict:
    console = _console(console)
    resolved = _config(source)
    if resolved.dataset is None and resolved.evals is not None:  # an evaluation-only config
        return evaluate_config(resolved, console=console)
    tokenizer, renderer, prepared = _prepare(resolved, console)
    _check_training_arguments(resolved, has_eval=bool(prepared.eval))
    plan = plan_run(resolved, outputs_root=Path(outputs_root) if outputs_root else None)
    check_rollout_engine(resolved)  # vLLM installed where use_vllm says so (plan does not need it)
    check_judge_server(resolved, console)  # an external judge answers (and serves its model)
    if plan.finished is None:  # (a finished run trains nothing: the user's code is not run for it)
        check_custom_rewards(resolved, prepared, tokenizer, console)  # called once on the first rows
    devices = device_plan(resolved)
    check_generation_batch(resolved, devices.workers)
    epoch_steps(resolved, len(prepared.train), devices.workers)  # GRPO: prompts that fill no generation batch
    _check_async_eval(resolved, devices)
    plan.changes = check_resume_matches(resolved, plan, fingerprint(prepared), devices.workers)
    _check_run_folder_free(plan)
    if callbacks and (not devices.in_process or devices.own_process):
        raise ValueError("run_config(callbacks=...) needs an in-process run (one device, the machine's only GPU or "
                         f"the CPU); this plan has {devices.workers} worker(s) on GPU(s) {devices.training} of "
                         f"{devices.gpus_per_node}: make one GPU visible (CUDA_VISIBLE_DEVICES=N) or drop callbacks")
    console.print(config_table(resolved))
    data_report(console, prepared, resolved)
    _print_plan_notes(console, plan)
    if plan.finished is not None:
        return {**plan.finished, "run_dir": str(plan.run_dir), "already_finished": True}
    resolved = resolved.model_copy(update={
        "run_dir": str(plan.run_dir), "run_name": plan.run_name, "workers": devices.workers,
        "resume_checkpoint_path": str(plan.resume_checkpoint) if plan.resume_checkpoint else None,
        "resume_changes": {k: list(v) for k, v in plan.changes.items()},
        "eval_devices": physical_ids(devices.eval),  # the reserved evaluation server's ("" without GPUs)
    })
    servers = local_servers(resolved, devices)  # GRPO's rollout server and judge, started before training
    resolved = resolved.model_copy(update={"judge_url": judge_url(resolved)})
    lock = _write_run_folder(resolved, prepared, renderer, plan)  # (the folder is this run's alone from here)
    try:
        return _train(resolved, prepared, plan, devices, servers, lock, console, callbacks, log)
    finally:
        lock.release()


def _train(resolved, prepared, plan, devices, servers, lock, console, callbacks, log) -> dict:
    log.attach(RunFolder(plan.run_dir).train_log)
    _print_plan(console, resolved, prepared, plan, devices)

    from leap_finetune.recipes import recipe

    resolved = resolved.model_copy(update={"run_token": lock.token})
    payload = json.loads(json.dumps(resolved.to_json_dict()))
    try:
        with running(servers, RunFolder(plan.run_dir).servers, console):
            if devices.own_process:
                from leap_finetune.launch.single import run_in_child

                summary = run_in_child(payload, devices, plan.run_dir)
            elif devices.in_process:
                summary = recipe(resolved.training_type).train(payload, callbacks=callbacks)
            else:
                from leap_finetune.launch.distributed import run_on_ray

                run_on_ray(payload, devices, plan.run_dir)
                summary = json.loads(RunFolder(plan.run_dir).summary.read_text(encoding="utf-8"))
    except BaseException as err:
        # A new run that failed before its first complete checkpoint (a mistake only the worker can find,
        # such as a model folder without weights, or a bug, or Ctrl-C while the model loads) holds nothing
        # worth keeping: it is removed, so the corrected config can use the same output_dir. The
        # servers' logs are kept elsewhere (they explain a server that did not start).
        from leap_finetune.launch.plan import newest_intact

        kept = newest_intact(plan.run_dir)[0] if plan.run_dir.is_dir() else None
        if plan.new_run and kept is None:
            _keep_server_logs(console, plan.run_dir)
            shutil.rmtree(plan.run_dir, ignore_errors=True)
        if isinstance(err, KeyboardInterrupt):
            raise _stopped(err, plan, kept) from None
        raise
    signals.enter("finishing")  # the model card and report are written whatever signal comes now
    summary["run_dir"] = str(plan.run_dir)
    if summary.get("error"):  # the worker stopped the run on a mistake of the user's (a judge down for good)
        raise LeapError(summary["error"]["message"], where=summary["error"].get("where"), fix=summary["error"].get("fix"))
    if summary.get("model_dir") and not summary.get("stopped_early"):
        from leap_finetune.launch.model_card import write_model_cards

        write_model_cards(resolved, prepared, summary, devices_line(devices))
    _print_end(console, summary)
    if not summary.get("stopped_early"):
        from leap_finetune.launch.report import end_report

        end_report(console, resolved, summary)
    return summary


def _stopped(err: KeyboardInterrupt, plan, kept: Path | None) -> signals.Stopped:
    """What a stop by a signal left: nothing (a new run without a checkpoint is removed), or a checkpoint."""
    import signal as signal_module

    stopped = err if isinstance(err, signals.Stopped) else signals.Stopped(signal_module.SIGINT, "")
    if kept is None and plan.new_run:
        stopped.note = "nothing was saved (no checkpoint yet); the new run folder was removed"
    elif kept is not None:
        stopped.note = (f"the last complete checkpoint is {kept}: continue with training_config."
                        "resume_from_checkpoint: latest")
    else:
        stopped.note = f"no complete checkpoint in {plan.run_dir}"
    return stopped


def _keep_server_logs(console: Console, run_dir: Path) -> None:
    import tempfile

    logs = run_dir / "servers"
    try:
        if logs.is_dir() and any(logs.iterdir()):
            kept = Path(tempfile.mkdtemp(prefix=f"leap-finetune-{run_dir.name}-servers-"))
            shutil.copytree(logs, kept, dirs_exist_ok=True)
            console.print(f"the servers' logs of this run are kept in {kept}")
    except OSError:  # never hide the error that ended the run
        pass


def _write_run_folder(resolved: ResolvedConfig, prepared: PreparedData, renderer, plan):
    """Everything the worker needs, written to a temporary folder and renamed into place, so a
    failure here leaves no half-written run folder. Returns the run folder's lock, held by this process
    (a resume takes it before it changes anything; a new run's folder arrives with it)."""
    from leap_finetune.launch.run_lock import RunLock
    from leap_finetune.recipes.common import quiet_libraries
    from leap_finetune.signals import clear_request

    quiet_libraries()
    run_dir = Path(resolved.run_dir)
    staging = Path(tempfile_folder(run_dir))
    lock = None
    try:
        if not plan.new_run:
            lock = RunLock.take(run_dir)
        lock = _stage_run_folder(resolved, prepared, renderer, plan.new_run, run_dir, staging, lock)
        if not plan.new_run:
            rewind(plan)
            clear_request(run_dir)  # (a stop request of the run that was stopped)
            record_changes(plan, plan.changes)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        if lock is not None:
            lock.release()
        raise disk_error(err, run_dir) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if lock is not None:
            lock.release()
        raise
    return lock


def tempfile_folder(run_dir: Path) -> str:
    """A staging folder beside the run folder, of this process alone (two runs never share one); stagings of
    processes of this host that died are removed."""
    import socket
    import tempfile

    from leap_finetune.files import pid_alive

    host = socket.gethostname().replace("-", "_")  # (a shared file system: only this host's processes are known)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    for old in run_dir.parent.glob(f".{run_dir.name}.staging-{host}-*"):
        pid = old.name.rsplit("-", 2)[-2]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f".{run_dir.name}.staging-{host}-{os.getpid()}-", dir=run_dir.parent)


def disk_error(err: OSError, path: Path) -> LeapError:
    """An OSError while writing, said in the user's words: which folder, what the system said, what to do."""
    import errno

    if err.errno == errno.ENOSPC:
        return LeapError(f"the disk is full ({err.filename or path})", where=str(path),
                         fix="free space on that disk (or set output_dir to a disk with space) and run again; "
                         "complete checkpoints of the run are intact: resume with resume_from_checkpoint: latest")
    if err.errno == errno.EDQUOT:
        return LeapError(f"the disk quota is exceeded ({err.filename or path})", where=str(path),
                         fix="free space within your quota, or set output_dir elsewhere; complete checkpoints are "
                         "intact: resume with resume_from_checkpoint: latest")
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return LeapError(f"cannot write there: {err.strerror} ({err.filename or path})", where=str(path),
                         fix="set output_dir to a folder you can write in")
    return LeapError(f"cannot write the run folder: {err.strerror or err}", where=str(path),
                     fix="check the disk space and permissions there, or set output_dir")


def _stage_run_folder(resolved: ResolvedConfig, prepared: PreparedData, renderer, new_run: bool,
                      run_dir: Path, staging: Path, lock=None):
    from leap_finetune.launch.run_lock import (
        LOCK_NAME,
        RunLock,
        busy_error,
        read_holder,
    )
    from leap_finetune.recipes.common import PREPARED_DIR

    staging.mkdir(parents=True, exist_ok=True)
    RunFolder(staging).resolved_config.write_text(dump_yaml(resolved.to_json_dict()), encoding="utf-8")
    if resolved.config_path:
        shutil.copy(resolved.config_path, RunFolder(staging).config_copy)
        if resolved.overrides:  # the file as written, and what the command line changed (resolved_config.yaml has both)
            with RunFolder(staging).config_copy.open("a", encoding="utf-8") as handle:
                handle.write("\n# overridden on the command line:\n" + "".join(f"#   --set {o}\n" for o in resolved.overrides))
    data = staging / PREPARED_DIR
    for name, rows in (("train", prepared.train), ("eval", prepared.eval)):
        if len(rows):
            rows.dataset().save_to_disk(str(data / name))
    (data / "samples.json").write_text(json.dumps(_samples(prepared, renderer)), encoding="utf-8")
    (data / "fingerprint.json").write_text(json.dumps(fingerprint(prepared)), encoding="utf-8")
    if resolved.retrieval is not None:  # a built-in tiny backbone, as a folder sentence-transformers loads
        from leap_finetune.recipes.retrieval import save_tiny_backbone

        save_tiny_backbone(resolved, staging)
    if prepared.dropped:
        with RunFolder(staging).dropped_rows.open("w", encoding="utf-8") as handle:
            for row in prepared.dropped:
                handle.write(json.dumps(row.to_json()) + "\n")
    if new_run:
        # The folder arrives locked: the lock is taken in the staging folder, and rename() puts it in place
        # whole, or fails when another run got there first (a non-empty folder is never replaced).
        lock = RunLock.take(staging)
        try:
            left = run_dir / LOCK_NAME  # the lock file of a run that used the folder and ended before a checkpoint
            if left.exists() and not any(p.name != LOCK_NAME for p in run_dir.iterdir()):
                from leap_finetune.launch.run_lock import is_live

                if not is_live(run_dir):
                    left.unlink(missing_ok=True)
            os.rename(staging, run_dir)
        except OSError as err:
            lock.release()
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            shutil.rmtree(staging, ignore_errors=True)
            if (run_dir / LOCK_NAME).exists():
                from leap_finetune.launch.run_lock import is_live

                if is_live(run_dir):
                    raise busy_error(run_dir, read_holder(run_dir), "output_dir") from None
            raise LeapError("the output folder exists and is not empty", where=str(run_dir),
                            fix="choose another output_dir, remove the folder, or resume with resume_from_checkpoint: "
                            "latest") from None
        lock.moved_to(run_dir)
        return lock
    # resuming: refresh the driver's files, keep checkpoints and metrics. Each is swapped by renames (the
    # old one moved aside, the new one moved in): a kill between them leaves the old or the new, never half.
    for item in staging.iterdir():
        target = run_dir / item.name
        if target.is_dir():
            aside = staging / f".old-{item.name}"
            os.rename(target, aside)
            os.rename(item, target)
        else:
            os.replace(item, target)
    shutil.rmtree(staging)
    return lock


def fingerprint(prepared: PreparedData) -> dict:
    """A hash of the token ids the trainer will read (train and eval), in order: a resume checks that
    the data are the run's (the data position in a checkpoint means nothing for other data)."""
    return {"train": prepared.train.fingerprint(), "eval": prepared.eval.fingerprint(), "train_rows": len(prepared.train),
            "eval_rows": len(prepared.eval)}


def _samples(prepared: PreparedData, renderer) -> list[dict]:
    """Prompts whose answers the worker prints before and after training."""
    samples = []
    for conversation in prepared.sample_messages:
        messages = conversation.messages
        answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not answers:
            continue
        # A tool-use conversation is best judged on its first tool call; others on the final answer.
        calls = [i for i in answers if "<|tool_call_start|>" in messages[i]["content"]]
        target = calls[0] if calls else answers[-1]
        users = [m for m in messages[:target] if m["role"] == "user"]
        samples.append({
            "prompt": renderer.prompt_text(messages[:target], conversation.tools),
            "question": users[-1]["content"] if users else "",
            "reference": messages[target]["content"],
        })
    return samples


def devices_line(devices) -> str:
    if devices.in_process:
        where = f"1 GPU (device {devices.training[0]})" if devices.use_gpu else "CPU"
        return f"devices: {where}, " + ("one training process (it sees only this GPU)" if devices.own_process
                                         else "in-process")
    kind = f"{len(devices.training)} GPU(s) per node: {devices.training}" if devices.use_gpu else "CPU workers"
    cluster = f"the Ray cluster at {devices.address}" if devices.address else "a local Ray instance"
    return (f"devices: {devices.workers} Ray Train workers ({devices.backend}) on {devices.nodes} node(s), {kind}; "
            f"{cluster}")


def _print_plan(console: Console, resolved: ResolvedConfig, prepared: PreparedData, plan, devices) -> None:
    t = resolved.training
    epoch = epoch_steps(resolved, len(prepared.train), devices.workers)
    steps = epoch.total(t)
    if t.get("packing") and not (t.get("max_steps") or 0) > 0:
        steps = f"<= {steps} (packing merges rows)"
    action = f"resuming from {plan.resume_checkpoint}" if plan.resume_checkpoint else "new run"
    rows = "prompts" if epoch.unit == "completions" else "rows"
    console.print(f"run: {plan.run_dir} ({action}); {len(prepared.train)} {rows}, {prepared.train_tokens:,} tokens, "
                  f"{steps} steps of {epoch.per_step} {epoch.unit}")
    if epoch.last_batch:
        console.print(epoch.last_batch)
    console.print(devices_line(devices))
    if judge_url(resolved) and devices.use_gpu and not devices.judge:
        console.print("[yellow]note: the judge runs on CPU (grpo_rollout.judge_gpus: 0): slow for a model of more "
                      "than a few hundred million parameters; give it GPUs with judge_gpus: 1[/yellow]")
    from leap_finetune.recipes import recipe

    args = recipe(resolved.training_type).training_arguments(resolved, run_dir=str(plan.run_dir), has_eval=bool(prepared.eval),
                                                             cuda=devices.use_gpu)
    precision = "bf16 mixed precision" if args.get("bf16") else "fp16 mixed precision" if args.get("fp16") else "float32"
    chosen = "set in training_config" if {"bf16", "fp16"} & set(resolved.training) else \
        "chosen automatically" + ("; float32 on a GPU without bf16" if devices.use_gpu else "")
    console.print(f"device: {'cpu' if args.get('use_cpu') else 'gpu'}, {precision} ({chosen})")


def _print_end(console: Console, summary: dict) -> None:
    if summary.get("stopped_early"):
        console.print(f"[yellow]stopped at step {summary['global_step']} (checkpoint saved); continue with "
                      "training_config.resume_from_checkpoint: latest[/yellow]")
        return
    parts = [f"done: {summary['global_step']} steps"]
    if summary.get("final_reward") is not None:
        parts.append(f"reward {summary['initial_reward']:.2f} -> {summary['final_reward']:.2f} (first / last 5 steps)")
        judge = summary.get("judge") or {}
        if judge.get("failures"):
            parts.append(f"judge failures {judge['failures']:,} of {judge['requests']:,}")
    else:
        parts.append(f"train loss {summary['train_loss']:.4f}")
    if summary.get("eval_loss") is not None:
        before = summary.get("initial_eval_loss")
        parts.append(f"eval loss {before:.4f} -> {summary['eval_loss']:.4f}" if before is not None
                     else f"eval loss {summary['eval_loss']:.4f}")
    if summary.get("ndcg@10") is not None:  # embedding / colbert: held-out retrieval
        before = summary.get("initial_ndcg@10")
        parts.append(f"held-out nDCG@10 {before:.2f} -> {summary['ndcg@10']:.2f}" if before is not None
                     else f"held-out nDCG@10 {summary['ndcg@10']:.2f}")
    for name, after in (summary.get("retrieval_benchmarks") or {}).items():
        before = (summary.get("initial_retrieval_benchmarks") or {}).get(name)
        parts.append(f"{name} nDCG@10 {before:.2f} -> {after:.2f}" if before is not None
                     else f"{name} nDCG@10 {after:.2f}")
    console.print(", ".join(parts))
    console.print(f"model: {summary['model_dir']}" + (f"  adapter: {summary['adapter_dir']}" if summary.get("adapter_dir") else ""))
