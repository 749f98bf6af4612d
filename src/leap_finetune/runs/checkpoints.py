"""Checkpoints that are complete whenever they say so, and their rotation.

The Trainer writes a checkpoint file by file, then (with `save_total_limit`) deletes old checkpoints
with `shutil.rmtree`; a process killed in either step leaves a folder that looks like a checkpoint.
Measured before this module (3 of 3 SIGKILLs during rotation): the old checkpoint half deleted, the
new one not yet marked, and `resume_from_checkpoint: latest` continued from the damaged one with a
fresh optimizer and scheduler (transformers skips state files that are missing), no warning.

So:
- a checkpoint counts only once its marker is written, last, atomically; the marker lists every file
  with its size, and a checkpoint is resumed from only if they all still match (`verify`);
- rotation is ours, not the Trainer's (its `save_total_limit` is handed to this callback): the marker
  of a checkpoint goes first, then its files; a folder without a marker is never resumed from;
- the marker also records how long metrics.jsonl was and how many seconds had been trained, so a
  resume cuts the log back to the checkpoint (no step logged twice) and the summary covers the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from leap_finetune import faults
from leap_finetune.runs.folder import CHECKPOINT_PREFIX

MARKER = "leap_checkpoint_complete.json"
# What a resumable checkpoint must hold besides the model weights (transformers silently starts a
# fresh optimizer or scheduler when one of these is missing).
STATE_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt")
WEIGHTS = (
    "model.safetensors",
    "adapter_model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "adapter_model.bin",
)


DIGEST_LIMIT = 64 * 2**20  # files up to this size get a SHA-256 in the marker


def file_digest(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def step_of(folder: Path) -> int:
    match = re.search(r"(\d+)$", folder.name)
    return int(match.group(1)) if match else -1


@dataclass
class Verdict:
    ok: bool
    problem: str = ""


def read_marker(folder: Path) -> dict | None:
    try:
        value = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def verify(folder: Path) -> Verdict:
    """A checkpoint can be resumed from: marked complete, every file of its manifest present with the
    recorded size, and the optimizer, scheduler and trainer state among them."""
    marker = read_marker(folder)
    if marker is None:
        return Verdict(False, "not marked complete (interrupted while saving or being deleted)")
    files = marker.get("files")
    if isinstance(files, dict):
        for name, size in files.items():
            path = folder / name
            if not path.is_file():
                return Verdict(False, f"{name} is missing")
            if path.stat().st_size != size:
                return Verdict(False, f"{name} has {path.stat().st_size} bytes, {size} were written")
    digests = marker.get("sha256")
    if isinstance(digests, dict):
        for name, expected in digests.items():
            path = folder / name
            if path.is_file() and file_digest(path) != expected:
                return Verdict(False, f"{name} changed since it was written (its SHA-256 differs)")
    present = {p.name for p in folder.iterdir()}
    missing = [name for name in STATE_FILES if name not in present]
    if missing:
        return Verdict(False, f"{', '.join(missing)} missing: resuming would restart the optimizer or scheduler")
    if not present & set(WEIGHTS):
        return Verdict(False, "no model weights")
    return Verdict(True)


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's checkpoint folders, oldest step first (complete or not)."""
    if not run_dir.is_dir():
        return []
    return sorted((p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir() and step_of(p) >= 0), key=step_of)


def delete(folder: Path) -> None:
    """Unmark first (and make that durable), then delete: at no instant is a partly deleted folder
    marked complete."""
    marker = folder / MARKER
    if marker.exists():
        marker.unlink()
        _fsync_dir(folder)
    faults.point("checkpoint-deleting")
    shutil.rmtree(folder, ignore_errors=True)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- look-ups: which checkpoint, which run ------------------------------------------------------------------


def newest_run(folder: Path) -> Path | None:
    """`folder` itself when it holds checkpoints, else its sub-folder (run) whose newest checkpoint
    marker was written last."""
    if not folder.is_dir():
        return None
    if any(read_marker(p) is not None for p in checkpoints(folder)):
        return folder
    runs = []
    for run in folder.iterdir():
        marked = [p for p in checkpoints(run) if (p / MARKER).exists()]
        if marked:
            runs.append((max(_saved_at(p) for p in marked), run))
    return max(runs)[1] if runs else None


def _saved_at(checkpoint: Path) -> float:
    """When the checkpoint was saved, by the clock of the process that saved it (recorded in its marker): a file's
    time comes from the clock of whichever host wrote it last (measured: clock skew made `latest` pick the wrong
    run). Markers written before this release: the file time."""
    saved = (read_marker(checkpoint) or {}).get("saved_at")
    if isinstance(saved, (int, float)):
        return float(saved)
    try:
        return (checkpoint / MARKER).stat().st_mtime
    except OSError:
        return 0.0


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
