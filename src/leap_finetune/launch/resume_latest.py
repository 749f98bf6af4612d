"""`resume_from_checkpoint: latest` (or `true`): the newest intact checkpoint of the newest run - never of an older
run past it. A run killed during start-up (before its first checkpoint) is the newest run all the same: measured
before this, `latest` skipped it and resumed an older, finished run, trained that on and overwrote its model and
summary. Also what a run killed during start-up leaves, which a plain re-run replaces (nothing in it can resume)."""

from __future__ import annotations

import json
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.errors import LeapError
from leap_finetune.launch.run_lock import LOCK_NAME, busy_error, is_live, read_holder
from leap_finetune.runs.checkpoints import MARKER, _saved_at, checkpoints, newest_intact
from leap_finetune.runs.folder import RunFolder


def startup_leftover(folder: Path) -> bool:
    """A run folder a run left during start-up: its driver's files (config, prepared rows, log, lock), at most
    checkpoint folders that never completed - no marked checkpoint, no final model or adapter, no summary. Nothing
    in it can be resumed, so a new run may take its place (a finished or resumable run is never replaced)."""
    run = RunFolder(folder)
    return (
        run.is_run()
        and not any((p / MARKER).exists() for p in checkpoints(run.path))
        and not any(p.exists() for p in (run.model, run.adapter, run.summary))
        and not users_files(run.path)
    )


def users_files(folder: Path) -> list[str]:
    """The names in a run folder that no run writes (sorted)."""
    return sorted(p.name for p in folder.iterdir() if not _written_by_a_run(p))


def _written_by_a_run(entry: Path) -> bool:
    """A name a run writes at start-up (runs/folder.py), its lock, or an unfinished checkpoint: anything else in the
    folder is the user's, and a folder holding it is never replaced (a re-run is refused as 'not empty')."""
    from leap_finetune.launch.run_lock import LOCK_NAME
    from leap_finetune.runs import folder as names

    written = {
        names.CONFIG_COPY, names.RESOLVED_CONFIG, names.PREPARED, names.DROPPED_ROWS, names.TRAIN_LOG, names.METRICS,
        names.COMPLETIONS, names.RESUME_CHANGES, names.BENCHMARKS, names.SERVERS, names.PLOTS, LOCK_NAME,
    }  # fmt: skip
    return entry.name in written or entry.name.startswith(names.CHECKPOINT_PREFIX)


def runs_newest_first(folder: Path) -> list[Path]:
    """The runs `latest` chooses among, newest first: `folder` itself when it is a run (an output_dir), else its run
    folders, by when each last started or saved a checkpoint (a run killed during start-up counts: it is newer)."""
    if not folder.is_dir():
        return []
    if _is_run(folder):
        return [folder]
    # (hidden folders: a run's staging folder, never a run)
    runs = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and _is_run(p)]
    return sorted(runs, key=_last_active, reverse=True)


def _is_run(folder: Path) -> bool:
    return RunFolder(folder).is_run() or any((p / MARKER).exists() for p in checkpoints(folder))


def _last_active(run: Path) -> float:
    """When the run last started (each start and resume rewrites its lock) or saved a checkpoint, by the clocks of
    the processes that did it (recorded; file times come from whichever host wrote the file last)."""
    return max([_started_at(run)] + [_saved_at(p) for p in checkpoints(run) if (p / MARKER).exists()])


def _started_at(run: Path) -> float:
    lock = run / LOCK_NAME
    try:
        recorded = json.loads(lock.read_text(encoding="utf-8")).get("started_at")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, (int, float)):
        return float(recorded)
    for path in (lock, RunFolder(run).resolved_config):  # (locks written before this release)
        try:
            return path.stat().st_mtime
        except OSError:
            continue
    return 0.0


def afresh_fix(resolved: ResolvedConfig, stopped: Path) -> str:
    """What to do about a run folder with nothing to resume - true in both layouts: with the default one a plain
    re-run makes a new run folder; with `output_dir` it starts afresh there, replacing a start-up's leftover."""
    if not resolved.output_dir:
        removable = f" (that folder can go: rm -r {stopped})" if startup_leftover(stopped) else ""
        return f"remove resume_from_checkpoint: the run then starts afresh, in a new run folder{removable}"
    output = Path(resolved.output_dir)
    if output.resolve() == Path(stopped).resolve() and startup_leftover(output):
        return (
            f"remove resume_from_checkpoint: a plain re-run then starts afresh in output_dir {output}, replacing "
            "what the stopped run left there"
        )
    return "remove resume_from_checkpoint and set another output_dir: the run then starts afresh there"


def latest_to_resume(resolved: ResolvedConfig, root: Path, key: str) -> tuple[Path, Path, list[str], list]:
    """(the run folder, its newest intact checkpoint, notes, the damaged checkpoints skipped) for `latest`, or the
    error that says why the newest run has nothing to resume and what to do."""
    searched = Path(resolved.output_dir) if resolved.output_dir else root
    runs = runs_newest_first(searched)
    if not runs:
        raise LeapError(
            f"resume_from_checkpoint: latest, but no complete checkpoint exists under {searched}",
            where=key,
            fix="remove resume_from_checkpoint to start a new run, or point it at a checkpoint folder",
        )
    run_dir = runs[0]
    checkpoint, damaged = newest_intact(run_dir)
    notes = [f"{folder.name} is damaged ({problem}); not resumed from" for folder, problem in damaged]
    if checkpoint is not None:
        return run_dir, checkpoint, notes, damaged
    if is_live(run_dir):  # (starting: its first checkpoint is still to come)
        raise busy_error(run_dir, read_holder(run_dir), "the run folder")
    said = f" ({'; '.join(notes)})" if notes else ""
    older = next((found for run in runs[1:] if (found := newest_intact(run)[0]) is not None), None)
    other = f"; or, to continue the older run {older.parent.name}, name its checkpoint: {older}" if older else ""
    if damaged:
        raise LeapError(
            f"resume_from_checkpoint: latest, but no complete checkpoint exists in the newest run, {run_dir}{said}",
            where=key,
            fix="point resume_from_checkpoint at a checkpoint folder, or start a new run "
            + ("(remove resume_from_checkpoint)" if not resolved.output_dir else "(another output_dir)")
            + other,
        )
    ended = (
        "finished without saving a checkpoint"
        if RunFolder(run_dir).model.exists() or RunFolder(run_dir).adapter.exists()
        else "stopped before its first complete checkpoint"
    )
    raise LeapError(
        f"resume_from_checkpoint: latest, but the newest run, {run_dir}, {ended}: there is nothing to resume"
        + (" (`latest` is the newest run, never an older one past it)" if older else ""),
        where=key,
        fix=afresh_fix(resolved, run_dir) + other,
    )


def stopped_run_error(run_dir: Path):
    """output_dir holds a run stopped before its first checkpoint that a re-run does not replace (files of the
    user's are in it): what to do, without advice that would delete them."""
    from leap_finetune.errors import LeapError

    yours = users_files(run_dir)
    message = "the output folder holds a run that stopped before its first complete checkpoint: nothing in it to resume"
    if not yours:
        return LeapError(
            message, where=f"output_dir: {run_dir}", fix=f"remove the folder (rm -r {run_dir}) and run again"
        )
    return LeapError(
        f"{message}; it also holds files no run wrote ({', '.join(yours[:5])}), so a re-run does not replace it",
        where=f"output_dir: {run_dir}",
        fix="move your files out and run again (the run then starts afresh there), or choose another output_dir",
    )
