"""The driver's plan: where the run lives and which checkpoint it resumes from."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.errors import LeapError
from leap_finetune.recipes.checkpoints import MARKER, checkpoints, read_marker, step_of, verify

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


def outputs_folder(resolved: ResolvedConfig, outputs_root: Path | None = None) -> Path:
    """Where this project's runs go: `outputs/{project_name}` beside the config file (like every other
    relative path in it), so `resume_from_checkpoint: latest` finds the run from any working folder."""
    base = Path(resolved.config_dir) if resolved.config_dir else Path.cwd()
    root = outputs_root if outputs_root is not None else base / OUTPUTS_ROOT
    return Path(root).expanduser().resolve() / resolved.project_name


def check_writable(folder: Path, key: str) -> None:
    """The run folder can be created: its nearest existing parent is a folder we can write in. A
    probe file is made and removed there (read-only file systems and permissions both show)."""
    import errno
    import os
    import tempfile

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise LeapError("this is a file, not a folder", where=f"{key}: {folder}",
                        fix=f"set {key} to a folder path (it is created if missing)")
    parent = folder
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise LeapError(f"cannot create the folder: {parent} is a file", where=f"{key}: {folder}",
                        fix=f"set {key} to a path inside a folder")
    try:
        handle, probe = tempfile.mkstemp(prefix=".leap-write-check-", dir=parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        hint = "a read-only file system" if err.errno == errno.EROFS else "no permission to write" \
            if err.errno in (errno.EACCES, errno.EPERM) else reason
        raise LeapError(f"cannot write in {parent} ({hint})", where=f"{key}: {folder}",
                        fix=f"set {key} to a folder you can write in") from None


def plan_run(resolved: ResolvedConfig, *, outputs_root: Path | None = None) -> RunPlan:
    root = outputs_folder(resolved, outputs_root)
    resume = resolved.resume_from_checkpoint
    if resume:
        return _plan_resume(resolved, root)
    if resolved.output_dir:
        run_dir = Path(resolved.output_dir)
        check_writable(run_dir, "output_dir")
        if run_dir.is_dir() and any(run_dir.iterdir()):
            raise LeapError("the output folder exists and is not empty", where=f"output_dir: {run_dir}",
                            fix="choose another output_dir, remove the folder, or resume with "
                            "training_config.resume_from_checkpoint: latest")
        return RunPlan(run_dir, run_dir.name, None, new_run=True)
    check_writable(root, "output_dir (default: outputs/ beside the config)")
    run_name = resolved.training.get("run_name") or f"{resolved.training_type}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = root / run_name
    suffix = 1
    while run_dir.exists():  # two runs started in the same second
        suffix += 1
        run_dir = root / f"{run_name}-{suffix}"
    return RunPlan(run_dir, run_dir.name, None, new_run=True)


def _plan_resume(resolved: ResolvedConfig, root: Path) -> RunPlan:
    """The checkpoint to continue from: `latest` (the newest intact checkpoint of the newest run) or a
    given folder, verified file by file; what the resume will clean up; or "already finished"."""
    key = "training_config.resume_from_checkpoint"
    notes: list[str] = []
    if resolved.resume_from_checkpoint == "latest":
        searched = Path(resolved.output_dir) if resolved.output_dir else root
        run_dir = newest_run(searched)
        checkpoint = None
        if run_dir is not None:
            checkpoint, damaged = newest_intact(run_dir)
            notes += [f"{folder.name} is damaged ({problem}); not resumed from" for folder, problem in damaged]
        if checkpoint is None:
            raise LeapError(
                f"resume_from_checkpoint: latest, but no complete checkpoint exists under {searched}"
                + (f" ({'; '.join(notes)})" if notes else ""),
                where=key, fix="remove resume_from_checkpoint to start a new run, or point it at a checkpoint folder")
    else:
        checkpoint = Path(resolved.resume_from_checkpoint)
        if not checkpoint.is_dir():
            raise LeapError("no such checkpoint folder", where=f"{key}: {checkpoint}",
                            fix="use a checkpoint-N folder of an earlier run, or `latest`")
        _check_is_checkpoint(checkpoint, key)
        verdict = verify(checkpoint)
        if not verdict.ok:
            raise LeapError(f"this checkpoint cannot be resumed from: {verdict.problem}", where=f"{key}: {checkpoint}",
                            fix="use another checkpoint-N folder of the run, or `latest` (the newest intact one)")
        run_dir = checkpoint.parent
        newer = [p.name for p in checkpoints(run_dir) if step_of(p) > step_of(checkpoint) and verify(p).ok]
        if newer:
            raise LeapError(
                f"the run has newer complete checkpoints ({', '.join(newer)}); resuming from {checkpoint.name} in "
                "place would discard them", where=f"{key}: {checkpoint}",
                fix="use `latest`, or copy this checkpoint into a new folder and resume from the copy")
    check_writable(run_dir, "the run folder")
    marker = read_marker(checkpoint) or {}
    stale = [p for p in checkpoints(run_dir) if step_of(p) > step_of(checkpoint) or read_marker(p) is None]
    plan = RunPlan(run_dir, run_dir.name, checkpoint, new_run=False, notes=notes, stale=stale,
                   metrics_bytes=marker.get("metrics_bytes"), trained_seconds=marker.get("trained_seconds", 0.0))
    plan.finished = _finished(resolved, run_dir, checkpoint)
    return plan


def _check_is_checkpoint(folder: Path, key: str) -> None:
    """Say what the folder is when it is not a checkpoint-N folder (a run folder, a final model)."""
    if checkpoints(folder):
        raise LeapError("this is a run folder, not a checkpoint", where=f"{key}: {folder}",
                        fix=f"use `latest`, or one of its checkpoints: {folder / checkpoints(folder)[-1].name}")
    if (folder / "config.json").exists() and not (folder / "trainer_state.json").exists():
        raise LeapError("this is a saved model, not a checkpoint: it has no optimizer, scheduler or data position",
                        where=f"{key}: {folder}",
                        fix="resume from a checkpoint-N folder; to fine-tune this model further, set model_name to it")


# What a resume must keep: the run's model, data and the settings that decide what one step is.
RESUME_KEEPS = ("model_id", "training_type", "chat_template", "loss_on", "peft")
RESUME_KEEPS_DATA = ("path", "val_path", "limit", "test_size", "split", "subset", "on_invalid", "weight", "epochs")
RESUME_KEEPS_TRAINING = ("max_length", "packing", "padding_free", "seed", "truncation_mode", "model_init_kwargs")


def global_batch(config: dict) -> int:
    """Rows per optimizer step: per device x accumulation x workers (the number of workers may change on a
    resume as long as this does not)."""
    training = config.get("training") or {}
    return (training.get("per_device_train_batch_size", 8) * training.get("gradient_accumulation_steps", 1)
            * config.get("workers", 1))


def _dataset_changes(before, now) -> list[tuple]:
    """The dataset keys a resume must keep, for one source or a list of them (`dataset[1].weight`)."""
    many = isinstance(before, list) or isinstance(now, list)
    before = before if isinstance(before, list) else [before or {}]
    now = now if isinstance(now, list) else [now or {}]
    if len(before) != len(now):
        return [("dataset (the sources)", len(before), len(now))]
    return [(f"dataset[{i}].{k}" if many else f"dataset.{k}", old.get(k), new.get(k))
            for i, (old, new) in enumerate(zip(before, now)) for k in RESUME_KEEPS_DATA if old.get(k) != new.get(k)]


def check_resume_matches(resolved: ResolvedConfig, plan: RunPlan, data_fingerprint: dict | None,
                         workers: int = 1) -> None:
    """A resume continues the same run: the same model, data and step (the global batch: a different
    number of workers is fine when per-device batch x accumulation makes up for it); a config that
    changed one of them would train a different run from this one's optimizer state and data position."""
    import json

    from leap_finetune.config.yaml_io import read_yaml

    if plan.new_run or plan.finished is not None:
        return
    try:
        before = read_yaml(plan.run_dir / "resolved_config.yaml")
    except LeapError:
        return
    now = {**resolved.to_json_dict(), "workers": workers}
    changed = [("the global batch (per_device_train_batch_size x gradient_accumulation_steps x workers)",
                global_batch(before), global_batch(now))] if global_batch(before) != global_batch(now) else []
    changed += [(k, before.get(k), now.get(k)) for k in RESUME_KEEPS if before.get(k) != now.get(k)]
    changed += _dataset_changes(before.get("dataset"), now.get("dataset"))
    changed += [(f"training_config.{k}", (before.get("training") or {}).get(k), (now.get("training") or {}).get(k))
                for k in RESUME_KEEPS_TRAINING
                if (before.get("training") or {}).get(k) != (now.get("training") or {}).get(k)]
    saved = plan.run_dir / "prepared" / "fingerprint.json"
    if not changed and data_fingerprint is not None and saved.exists():
        old = json.loads(saved.read_text(encoding="utf-8"))
        if old != data_fingerprint:
            changed.append(("the prepared training data", f"{old.get('train_rows')} rows, {old.get('train')[:12]}",
                            f"{data_fingerprint.get('train_rows')} rows, {data_fingerprint.get('train')[:12]}"))
    if changed:
        listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changed[:6])
        raise LeapError(f"this config changes what the run at {plan.run_dir} trains: {listed}",
                        where="training_config.resume_from_checkpoint",
                        fix="a resume continues the same run: change these back, or start a new run (remove "
                        "resume_from_checkpoint)")


def _finished(resolved: ResolvedConfig, run_dir: Path, checkpoint: Path) -> dict | None:
    """The summary of a run that already ended at this checkpoint with the same length settings (a
    re-run of a finished run with `latest` has nothing to train); None otherwise."""
    import json

    from leap_finetune.config.yaml_io import read_yaml

    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        before = read_yaml(run_dir / "resolved_config.yaml").get("training") or {}
    except (OSError, json.JSONDecodeError, LeapError):
        return None
    if summary.get("stopped_early") or summary.get("global_step") != step_of(checkpoint) or "model_dir" not in summary:
        return None
    same_length = all(before.get(k) == resolved.training.get(k) for k in ("max_steps", "num_train_epochs"))
    return summary if same_length else None


def newest_run(folder: Path) -> Path | None:
    """`folder` itself when it holds checkpoints, else its sub-folder (run) whose newest checkpoint
    marker was written last."""
    if not folder.is_dir():
        return None
    if any(read_marker(p) is not None for p in checkpoints(folder)):
        return folder
    runs = []
    for run in folder.iterdir():
        marked = [p / MARKER for p in checkpoints(run) if (p / MARKER).exists()]
        if marked:
            runs.append((max(m.stat().st_mtime for m in marked), run))
    return max(runs)[1] if runs else None


def newest_intact(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that verifies, and the marked-complete ones newer than it that do not."""
    damaged = []
    for folder in reversed(checkpoints(run_dir)):
        if read_marker(folder) is None:
            continue  # never completed (or being deleted): not a checkpoint
        verdict = verify(folder)
        if verdict.ok:
            return folder, damaged
        damaged.append((folder, verdict.problem))
    return None, damaged


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest intact checkpoint in a run folder, or in the newest run of a project folder."""
    run_dir = newest_run(folder)
    return newest_intact(run_dir)[0] if run_dir is not None else None


def rewind(plan) -> None:
    """A resume continues from its checkpoint: checkpoint folders that never completed (or are newer
    and damaged) are removed, and the metrics log is cut back to what it held when the checkpoint was
    marked, so no step is logged twice."""
    from leap_finetune.recipes.checkpoints import delete

    for folder in plan.stale:
        delete(folder)
    metrics = plan.run_dir / "metrics.jsonl"
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
    folder = run_dir / "benchmarks" / "results"
    if not folder.is_dir():
        return
    from leap_finetune.files import read_metrics

    logged = {record.get("step") for record in read_metrics(metrics)
              if any(key.startswith("benchmark/") and key.endswith("/score") for key in record)}
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
