"""The driver's plan: where the run lives and which checkpoint it resumes from."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.resume import (
    OPERATIONAL,
    RESUME_ALLOWABLE,
    RESUME_FREE_PREFIXES,
    RESUME_FREE_TRAINING,
    RESUME_KEEPS,
    RESUME_KEEPS_DATA,
    RESUME_KEEPS_TRAINING,
)
from leap_finetune.errors import LeapError
from leap_finetune.files import check_writable
from leap_finetune.launch.resume_latest import afresh_fix, latest_to_resume, startup_leftover, stopped_run_error
from leap_finetune.launch.steps import accumulation, per_device_rows
from leap_finetune.runs.checkpoints import (
    checkpoints,
    latest_checkpoint,
    newest_intact,
    read_marker,
    step_of,
    verify,
)
from leap_finetune.runs.folder import RunFolder

OUTPUTS_ROOT = Path("outputs")


@dataclass
class RunPlan:
    run_dir: Path
    run_name: str
    resume_checkpoint: Path | None
    new_run: bool
    notes: list[str] = field(default_factory=list)  # said before the run starts (e.g. a damaged checkpoint skipped)
    # resuming: checkpoint folders removed before training continues (never completed, or newer than the
    # resume point), where metrics.jsonl is cut back to, and the training time before the checkpoint
    stale: list[Path] = field(default_factory=list)
    metrics_bytes: int | None = None
    trained_seconds: float = 0.0
    finished: dict | None = None  # the summary, when the run already ended at this checkpoint
    changes: dict = field(
        default_factory=dict
    )  # resume_allow_changes: {key: (before, now)} applied from the checkpoint


def outputs_folder(resolved: ResolvedConfig, outputs_root: Path | None = None) -> Path:
    """Where this project's runs go: `outputs/{project_name}` beside the config file (like every other
    relative path in it), so `resume_from_checkpoint: latest` finds the run from any working folder."""
    base = Path(resolved.config_dir) if resolved.config_dir else Path.cwd()
    root = outputs_root if outputs_root is not None else base / OUTPUTS_ROOT
    return Path(root).expanduser().resolve() / resolved.project_name


def plan_run(resolved: ResolvedConfig, *, outputs_root: Path | None = None) -> RunPlan:
    root = outputs_folder(resolved, outputs_root)
    resume = resolved.resume_from_checkpoint
    if resume:
        return _plan_resume(resolved, root)
    if resolved.output_dir:
        run_dir = Path(resolved.output_dir)
        check_writable(run_dir, "output_dir")
        from leap_finetune.launch.run_lock import LOCK_NAME

        if (
            run_dir.is_dir()
            and any(p.name != LOCK_NAME for p in run_dir.iterdir())
            or run_dir.is_dir()
            and (run_dir / LOCK_NAME).exists()
            and _held(run_dir)
        ):
            from leap_finetune.launch.run_lock import busy_error, is_live, read_holder

            if is_live(run_dir):
                raise busy_error(run_dir, read_holder(run_dir), "output_dir")
            if startup_leftover(run_dir):  # (a run killed during start-up: resuming it is impossible)
                left = ", ".join(sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_NAME))
                said = (
                    f"output_dir {run_dir} holds what a run stopped before its first checkpoint left ({left}): "
                    "nothing in it can be resumed, so this run starts afresh there and replaces it"
                )
                return RunPlan(run_dir, run_dir.name, None, new_run=True, notes=[said])
            if RunFolder(run_dir).is_run() and latest_checkpoint(run_dir) is None:
                raise stopped_run_error(run_dir)
            resumable = RunFolder(run_dir).is_run()  # (a folder of the user's own files has no run to resume)
            raise LeapError(
                "the output folder exists and is not empty",
                where=f"output_dir: {run_dir}",
                fix="choose another output_dir, or move what is in it elsewhere"
                + (", or resume with training_config.resume_from_checkpoint: latest" if resumable else ""),
            )
        return RunPlan(run_dir, run_dir.name, None, new_run=True)
    check_writable(root, "output_dir (default: outputs/ beside the config)")
    run_name = resolved.training.get("run_name") or f"{resolved.training_type}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = root / run_name
    suffix = 1
    while run_dir.exists():  # two runs started in the same second
        suffix += 1
        run_dir = root / f"{run_name}-{suffix}"
    return RunPlan(run_dir, run_dir.name, None, new_run=True)


def _held(folder: Path) -> bool:
    from leap_finetune.launch.run_lock import is_live

    return is_live(folder)


def _resume_key(resolved: ResolvedConfig) -> str:
    """Where a resume's mistake is: the config file, then the key (as every other config error says it)."""
    key = "training_config.resume_from_checkpoint"
    return f"{resolved.config_path}: {key}" if resolved.config_path else key


def _plan_resume(resolved: ResolvedConfig, root: Path) -> RunPlan:
    """The checkpoint to continue from: `latest` (the newest intact checkpoint of the newest run, never an older
    run's: launch/resume_latest.py) or a given folder, verified file by file; what the resume will clean up; or
    "already finished"."""
    key = _resume_key(resolved)
    notes: list[str] = []
    damaged: list = []
    if resolved.resume_from_checkpoint == "latest":
        run_dir, checkpoint, notes, damaged = latest_to_resume(resolved, root, key)
    else:
        checkpoint = _given_checkpoint(resolved, key, notes)
        run_dir = checkpoint.parent
    check_writable(run_dir, "the run folder")
    marker = read_marker(checkpoint) or {}
    stale = [p for p in checkpoints(run_dir) if step_of(p) > step_of(checkpoint) or read_marker(p) is None]
    said = {folder.name for folder, _ in damaged}
    notes += [
        f"{p.name} "
        + (
            "never completed (interrupted while saving)"
            if read_marker(p) is None
            else "is newer than the checkpoint resumed from"
        )
        + ": it is removed"
        for p in stale
        if p.name not in said
    ]
    plan = RunPlan(
        run_dir,
        run_dir.name,
        checkpoint,
        new_run=False,
        notes=notes,
        stale=stale,
        metrics_bytes=marker.get("metrics_bytes"),
        trained_seconds=marker.get("trained_seconds", 0.0),
    )
    plan.finished = _finished(resolved, run_dir, checkpoint)
    return plan


def _given_checkpoint(resolved: ResolvedConfig, key: str, notes: list[str]) -> Path:
    """The checkpoint `resume_from_checkpoint` names (a run folder: its newest intact one), verified; the newest of
    its run."""
    checkpoint = Path(resolved.resume_from_checkpoint)
    if not checkpoint.is_dir():
        base = resolved.config_dir or "."
        raise LeapError(
            "no such checkpoint folder (a relative path is read from the config's folder, "
            f"{base}, and from the current folder, {Path.cwd()}: neither has it)",
            where=f"{key}: {checkpoint}",
            fix="use a checkpoint-N folder of an earlier run (an absolute path is never ambiguous), its run folder, "
            "or `latest`",
        )
    if checkpoints(checkpoint):  # (a run folder: its newest intact checkpoint, as `latest` takes it)
        found, damaged = newest_intact(checkpoint)
        notes += [f"{folder.name} is damaged ({problem}); not resumed from" for folder, problem in damaged]
        if found is None:
            raise LeapError(
                "this run folder has no complete checkpoint to resume from"
                + (f" ({'; '.join(notes)})" if notes else ""),
                where=f"{key}: {checkpoint}",
                fix=afresh_fix(resolved, checkpoint),
            )
        notes.append(f"{checkpoint} is a run folder: resuming from its newest complete checkpoint, {found.name}")
        checkpoint = found
    elif RunFolder(checkpoint).is_run():
        raise LeapError(
            "this run folder has no complete checkpoint to resume from (it stopped before its first one)",
            where=f"{key}: {checkpoint}",
            fix=afresh_fix(resolved, checkpoint),
        )
    _check_is_checkpoint(checkpoint, key)
    verdict = verify(checkpoint)
    if not verdict.ok:
        raise LeapError(
            f"this checkpoint cannot be resumed from: {verdict.problem}",
            where=f"{key}: {checkpoint}",
            fix="use another checkpoint-N folder of the run, or `latest` (the newest intact one)",
        )
    run_dir = checkpoint.parent
    newer = [p.name for p in checkpoints(run_dir) if step_of(p) > step_of(checkpoint) and verify(p).ok]
    if newer:
        raise LeapError(
            f"the run has newer complete checkpoints ({', '.join(newer)}); resuming from {checkpoint.name} in "
            "place would discard them",
            where=f"{key}: {checkpoint}",
            fix="use `latest`, or copy this checkpoint into a new folder and resume from the copy",
        )
    return checkpoint


def _check_is_checkpoint(folder: Path, key: str) -> None:
    """Say what the folder is when it is not a checkpoint-N folder (a final model; a run folder is taken as its
    newest checkpoint before this)."""
    if (folder / "config.json").exists() and not (folder / "trainer_state.json").exists():
        raise LeapError(
            "this is a saved model, not a checkpoint: it has no optimizer, scheduler or data position",
            where=f"{key}: {folder}",
            fix="resume from a checkpoint-N folder; to fine-tune this model further, set model_name to it",
        )


def _compared(config: dict, key: str):
    """config[key] without its operational keys."""
    value = config.get(key)
    if not isinstance(value, dict):
        return value
    value = json.loads(json.dumps(value))
    for part, names in OPERATIONAL.get(key, {}).items():
        target = value.get(part) if part else value
        if isinstance(target, dict):
            for name in names:
                target.pop(name, None)
    return value


def global_batch(config: dict) -> int:
    """Rows per optimizer step: per device x accumulation x workers (the number of workers may change on a
    resume as long as this does not)."""
    training = config.get("training") or {}
    return per_device_rows(training) * accumulation(training) * config.get("workers", 1)


def _dataset_changes(before, now) -> list[tuple]:
    """The dataset keys a resume must keep, for one source or a list of them (`dataset[1].weight`)."""
    many = isinstance(before, list) or isinstance(now, list)
    before = before if isinstance(before, list) else [before or {}]
    now = now if isinstance(now, list) else [now or {}]
    if len(before) != len(now):
        return [("dataset (the sources)", len(before), len(now))]
    return [
        (f"dataset[{i}].{k}" if many else f"dataset.{k}", old.get(k), new.get(k))
        for i, (old, new) in enumerate(zip(before, now))
        for k in RESUME_KEEPS_DATA
        if old.get(k) != new.get(k)
    ]


def resumed_config(plan: RunPlan) -> tuple[dict | None, dict | None]:
    """The config and data fingerprint the run had when its checkpoint was saved: recorded in the checkpoint's
    marker (since this release), else the run folder's resolved_config.yaml and prepared/fingerprint.json."""
    from leap_finetune.config.yaml_io import read_yaml

    marker = read_marker(Path(plan.resume_checkpoint)) if plan.resume_checkpoint else None
    config = (marker or {}).get("config")
    data = (marker or {}).get("data")
    if config is None:
        try:
            config = read_yaml(RunFolder(plan.run_dir).resolved_config)
        except LeapError:
            config = None
    if data is None:
        try:
            data = json.loads(RunFolder(plan.run_dir).fingerprint.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            data = None
    return config, data


def check_resume_matches(
    resolved: ResolvedConfig, plan: RunPlan, data_fingerprint: dict | None, workers: int = 1
) -> dict:
    """A resume continues the same run: the same model, data and step (the global batch: a different
    number of workers is fine when per-device batch x accumulation makes up for it), and the same optimization
    unless `training_config.resume_allow_changes` names the keys that change (then they apply from the resumed
    step on, and the run records it). Returns the allowed changes {key: (before, now)}; raises, listing the
    differences, for anything else."""
    if plan.new_run or plan.finished is not None:
        return {}
    allow = resolved.training.get("resume_allow_changes") or []
    before, saved_data = resumed_config(plan)
    key = _resume_key(resolved)
    if before is None:
        if allow == ["all"]:
            return {}
        raise LeapError(
            f"cannot check that this config continues the run at {plan.run_dir}: its checkpoint does not "
            "record the run's config and resolved_config.yaml is missing",
            where=key,
            fix="restore resolved_config.yaml in the run folder, or set training_config.resume_allow_changes: "
            "[all] to resume with this config as it is",
        )
    now = {**resolved.to_json_dict(), "workers": workers}
    fixed = _fixed_changes(before, now, saved_data, data_fingerprint)
    if fixed:
        listed = "; ".join(f"{name}: {old!r} -> {new!r}" for name, old, new in fixed[:6])
        raise LeapError(
            f"this config changes what the run at {plan.run_dir} trains: {listed}",
            where=key,
            fix="a resume continues the same run (its data, model and optimizer state): change these back, "
            "or start a new run (remove resume_from_checkpoint)",
        )
    changed = _allowable_changes(before, now)
    refused = {k: v for k, v in changed.items() if allow != ["all"] and k.removeprefix("training_config.") not in allow}
    if refused:
        listed = "; ".join(f"{name}: {_shown(old)} -> {_shown(new)}" for name, (old, new) in list(refused.items())[:6])
        names = ", ".join(k.removeprefix("training_config.") for k in refused)
        raise LeapError(
            f"this config changes how the run at {plan.run_dir} trains: {listed}",
            where=key,
            fix=f"change them back to continue the run as it was, or apply them from the resumed step on "
            f"with training_config.resume_allow_changes: [{names}] (recorded in the run's "
            "resume_changes.json and model card)",
        )
    return changed


def _fixed_changes(before: dict, now: dict, saved_data: dict | None, data_fingerprint: dict | None) -> list[tuple]:
    """(name, before, now) of what a resume may not change: the global batch, the model and training type, the
    dataset's keys, the rows' making (max_length, packing, seeds ...), a plateau scheduler; then, all those kept,
    the prepared rows themselves."""
    fixed = (
        [
            (
                "the global batch (per_device_train_batch_size x gradient_accumulation_steps x workers)",
                global_batch(before),
                global_batch(now),
            )
        ]
        if global_batch(before) != global_batch(now)
        else []
    )
    fixed += [(k, before.get(k), now.get(k)) for k in RESUME_KEEPS if _compared(before, k) != _compared(now, k)]
    fixed += _dataset_changes(before.get("dataset"), now.get("dataset"))
    old_training, new_training = before.get("training") or {}, now.get("training") or {}
    fixed += [
        (f"training_config.{k}", old_training.get(k), new_training.get(k))
        for k in RESUME_KEEPS_TRAINING
        if old_training.get(k) != new_training.get(k)
    ]
    scheduler = "reduce_lr_on_plateau" in (
        old_training.get("lr_scheduler_type"),
        new_training.get("lr_scheduler_type"),
    ) and old_training.get("lr_scheduler_type") != new_training.get("lr_scheduler_type")
    if scheduler:
        fixed.append(
            (
                "training_config.lr_scheduler_type",
                old_training.get("lr_scheduler_type"),
                new_training.get("lr_scheduler_type"),
            )
        )
    if not fixed and data_fingerprint is not None and saved_data is not None and saved_data != data_fingerprint:
        fixed.append(
            (
                "the prepared training data",
                f"{saved_data.get('train_rows')} rows, {str(saved_data.get('train'))[:12]}",
                f"{data_fingerprint.get('train_rows')} rows, {str(data_fingerprint.get('train'))[:12]}",
            )
        )
    return fixed


def _allowable_changes(before: dict, now: dict) -> dict:
    """{name: (before, now)} of the changes resume_allow_changes may allow: the other training_config keys (those a
    resume changes freely left out: config/resume.py) and the rewards."""
    old_training, new_training = before.get("training") or {}, now.get("training") or {}
    changed = {
        f"training_config.{k}": (old_training.get(k), new_training.get(k))
        for k in sorted(set(old_training) | set(new_training))
        if k not in RESUME_FREE_TRAINING
        and not k.startswith(RESUME_FREE_PREFIXES)
        and old_training.get(k) != new_training.get(k)
    }
    changed.update(
        {k: (before.get(k), now.get(k)) for k in RESUME_ALLOWABLE if _compared(before, k) != _compared(now, k)}
    )
    return changed


def _shown(value) -> str:
    """A setting's value in a resume refusal; a key one side does not set says so (not `None`)."""
    return "(not set)" if value is None else repr(value)


def record_changes(plan: RunPlan, changed: dict) -> None:
    """The changes a resume applies, appended to RUN/resume_changes.json (the model card lists them)."""
    if not changed or plan.resume_checkpoint is None:
        return
    from leap_finetune.files import write_atomic

    path = RunFolder(plan.run_dir).resume_changes
    try:
        history = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        history = []
    step = step_of(Path(plan.resume_checkpoint))
    history = [h for h in history if isinstance(h, dict) and h.get("step", 0) < step]  # (a resume of a resume)
    history += [{"step": step, "key": k, "before": old, "now": new} for k, (old, new) in changed.items()]
    write_atomic(path, json.dumps(history, indent=1))


def _finished(resolved: ResolvedConfig, run_dir: Path, checkpoint: Path) -> dict | None:
    """The summary of a run that already ended at this checkpoint with the same length settings (a
    re-run of a finished run with `latest` has nothing to train); None otherwise."""
    import json

    from leap_finetune.config.yaml_io import read_yaml

    try:
        summary = json.loads(RunFolder(run_dir).summary.read_text(encoding="utf-8"))
        before = read_yaml(RunFolder(run_dir).resolved_config).get("training") or {}
    except (OSError, json.JSONDecodeError, LeapError):
        return None
    if summary.get("stopped_early") or summary.get("global_step") != step_of(checkpoint) or "model_dir" not in summary:
        return None
    same_length = all(before.get(k) == resolved.training.get(k) for k in ("max_steps", "num_train_epochs"))
    return summary if same_length else None


def rewind(plan) -> None:
    """A resume continues from its checkpoint: checkpoint folders that never completed (or are newer
    and damaged) are removed, and the metrics log is cut back to what it held when the checkpoint was
    marked, so no step is logged twice."""
    from leap_finetune.runs.checkpoints import delete

    for folder in plan.stale:
        delete(folder)
    metrics = RunFolder(plan.run_dir).metrics
    if plan.metrics_bytes is not None and metrics.exists() and metrics.stat().st_size > plan.metrics_bytes:
        with metrics.open("r+b") as handle:
            handle.truncate(plan.metrics_bytes)
            handle.flush()
            os.fsync(handle.fileno())
    if plan.resume_checkpoint is not None:
        restore_benchmark_results(plan.run_dir, metrics, step_of(Path(plan.resume_checkpoint)))


def restore_benchmark_results(run_dir: Path, metrics: Path, step: int) -> None:
    """Async evaluations (sidecar, reserved) report after the checkpoint of their step was marked, so the cut
    above drops them: the results of steps up to the checkpoint's are logged again from
    benchmarks/results/step-N.json; those of later steps belong to the discarded steps and are evaluated again
    by the resumed run."""
    folder = RunFolder(run_dir).benchmark_results
    if not folder.is_dir():
        return
    from leap_finetune.files import read_metrics

    logged = {
        record.get("step")
        for record in read_metrics(metrics)
        if any(key.startswith("benchmark/") and key.endswith("/score") for key in record)
    }
    restored = []
    for path in sorted(folder.glob("step-*.json"), key=lambda p: int(p.stem.split("-")[1])):
        evaluated = int(path.stem.split("-")[1])
        if evaluated > step:
            path.unlink()
        elif evaluated not in logged:
            restored.append({"step": evaluated, **json.loads(path.read_text(encoding="utf-8"))["results"]})
    if restored:
        with metrics.open("a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in restored)
