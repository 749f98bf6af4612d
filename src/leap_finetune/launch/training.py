"""A checked run trained: the worker started where the device plan says, the servers beside it, the run folder
cleaned up after a failure, the end reported once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rich.console import Console

from leap_finetune import signals
from leap_finetune.errors import LeapError
from leap_finetune.launch.evaluator import evaluating
from leap_finetune.launch.facts import run_facts
from leap_finetune.launch.reports.report import end_report, print_start
from leap_finetune.runs.folder import RunFolder
from leap_finetune.runs.processes import running


def train_run(resolved, prepared, plan, devices, servers, lock, console, callbacks, log) -> dict:
    """Train in the process the device plan chose (this one, a one-GPU child, Ray Train workers) with the
    servers running; then the model cards and the end report. A new run that stopped before its first
    checkpoint is removed (nothing in it is worth keeping; the corrected config can use the same output_dir)."""
    log.attach(RunFolder(plan.run_dir).train_log)
    facts = run_facts(resolved, prepared, devices)
    print_start(console, resolved, prepared, plan, devices, facts)

    from leap_finetune.recipes import recipe

    resolved = resolved.model_copy(update={"run_token": lock.token})
    payload = json.loads(json.dumps(resolved.to_json_dict()))
    try:
        # the servers (GRPO's rollout server and judge) and the evaluations of async_eval: started here, by the
        # driver, never by a training process
        with running(servers, RunFolder(plan.run_dir).servers, console), evaluating(resolved, plan.run_dir):
            if devices.own_process:
                from leap_finetune.launch.single import run_in_child

                summary = run_in_child(payload, devices, plan.run_dir)
            elif devices.in_process:
                summary = recipe(resolved.training_type, to_train=True).train(payload, callbacks=callbacks)
            else:
                from leap_finetune.launch.distributed import run_on_ray

                run_on_ray(payload, devices, plan.run_dir)
                summary = json.loads(RunFolder(plan.run_dir).summary.read_text(encoding="utf-8"))
    except BaseException as err:
        # A new run that failed before its first complete checkpoint (a mistake only the worker can find,
        # such as a model folder without weights, or a bug, or Ctrl-C while the model loads) holds nothing
        # worth keeping: it is removed, so the corrected config can use the same output_dir. The
        # servers' logs are kept elsewhere (they explain a server that did not start).
        from leap_finetune.runs.checkpoints import newest_intact

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
        raise LeapError(
            summary["error"]["message"], where=summary["error"].get("where"), fix=summary["error"].get("fix")
        )
    if summary.get("model_dir") and not summary.get("stopped_early"):
        from leap_finetune.launch.reports.model_card import write_model_cards

        write_model_cards(resolved, prepared, summary, facts)
    end_report(console, resolved, summary)
    return summary


def _stopped(err: KeyboardInterrupt, plan, kept: Path | None) -> signals.Stopped:
    """What a stop by a signal left: nothing (a new run without a checkpoint is removed), or a checkpoint."""
    import signal as signal_module

    stopped = err if isinstance(err, signals.Stopped) else signals.Stopped(signal_module.SIGINT, "")
    if kept is None and plan.new_run:
        stopped.note = "nothing was saved (no checkpoint yet); the new run folder was removed"
    elif kept is not None:
        stopped.note = (
            f"the last complete checkpoint is {kept}: continue with training_config.resume_from_checkpoint: latest"
        )
    else:
        stopped.note = f"no complete checkpoint in {plan.run_dir}"
    return stopped


def _keep_server_logs(console: Console, run_dir: Path) -> None:
    import tempfile

    logs = RunFolder(run_dir).servers
    try:
        if logs.is_dir() and any(logs.iterdir()):
            kept = Path(tempfile.mkdtemp(prefix=f"leap-finetune-{run_dir.name}-servers-"))
            shutil.copytree(logs, kept, dirs_exist_ok=True)
            console.print(f"the servers' logs of this run are kept in {kept}")
    except OSError:  # never hide the error that ended the run
        pass
