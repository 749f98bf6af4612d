"""The hand-off of asynchronous evaluations between rank 0, which snapshots the model, and the driver, which starts
every process of the run (the evaluation server, the sbatch jobs): files in RUN/benchmarks/snapshots/, so it works
the same whether rank 0 is the driver's own process, a one-GPU child or a Ray Train worker.

  step-N/              a snapshot (model/, eval.yaml, snapshot.json), renamed into place when complete: a request
  step-N/claim         written once, by whoever decides the snapshot's fate first: `evaluate` (the driver starts
                       it) or `cancel` (rank 0 no longer wants it: skipped, or training ended) - never both
  step-N/outcome.json  the driver's answer: the results, or why the evaluation failed (and where its log is)
  STOP                 rank 0: stop the running evaluation (training stopped early, or past async_eval.wait_at_end_s)
  DRIVER               the driver's heartbeat (touched every poll): rank 0 does not wait for a driver that is gone
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from leap_finetune.evaluation.snapshot import Outcome, Snapshot
from leap_finetune.files import write_atomic

CLAIM = "claim"
OUTCOME = "outcome.json"
DESCRIPTION = "snapshot.json"
STOP = "STOP"
HEARTBEAT = "DRIVER"
HEARTBEAT_STALE_S = 60.0


def describe(snapshot: Snapshot) -> None:
    """What the driver needs besides the model: the step, when it was taken, the trainer's epoch there."""
    write_atomic(
        snapshot.folder / DESCRIPTION,
        json.dumps({"step": snapshot.step, "when": snapshot.when, "epoch": snapshot.epoch}),
    )


def requests(snapshots: Path) -> list[Snapshot]:
    """Complete snapshots nobody has claimed yet, oldest step first."""
    found = []
    for folder in snapshots.glob("step-*") if snapshots.is_dir() else ():
        if (folder / CLAIM).exists():
            continue
        try:
            described = json.loads((folder / DESCRIPTION).read_text(encoding="utf-8"))
            found.append(Snapshot(described["step"], described["when"], folder, described.get("epoch")))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # (being removed)
    return sorted(found, key=lambda s: s.step)


def claim(folder: Path, decision: str) -> bool:
    """Decide the snapshot's fate, if nobody has: True when this call decided (O_EXCL: one of the two sides wins,
    however close together they ask). A snapshot that is gone, or a disk that refuses the file, is not claimed."""
    try:
        handle = os.open(folder / CLAIM, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return False
    with os.fdopen(handle, "w") as file:
        file.write(decision)
    return True


def remove(folder: Path) -> None:
    """A snapshot taken away: first renamed out of the `step-*` names (so the driver, which may hold an older
    listing, can never claim a half-deleted one), then deleted."""
    gone = folder.with_name(f".removed-{folder.name}-{os.getpid()}")
    try:
        os.rename(folder, gone)
    except OSError:
        gone = folder
    shutil.rmtree(gone, ignore_errors=True)


def answer(folder: Path, outcome: Outcome) -> bool:
    """The outcome written beside the snapshot; False when it could not be (a full disk: the driver tries again)."""
    record = {
        "results": outcome.results,
        "reason": outcome.reason,
        "log": str(outcome.log) if outcome.log else None,
        "seconds": outcome.seconds,
    }
    try:
        write_atomic(folder / OUTCOME, json.dumps(record))
    except FileNotFoundError:
        return True  # rank 0 removed the snapshot meanwhile (training ended): nobody waits for this answer
    except OSError:
        return False
    return True


def answered(folder: Path) -> Outcome | None:
    try:
        data = json.loads((folder / OUTCOME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Outcome(
        results=data["results"],
        reason=data["reason"],
        log=Path(data["log"]) if data["log"] else None,
        seconds=data.get("seconds"),
    )


def ask_to_stop(snapshots: Path) -> None:
    snapshots.mkdir(parents=True, exist_ok=True)
    (snapshots / STOP).touch()


def beat(snapshots: Path, count: int) -> None:
    """The driver's heartbeat: a counter, not a file time (rank 0 may run on another host, with another clock)."""
    try:
        snapshots.mkdir(parents=True, exist_ok=True)
        write_atomic(snapshots / HEARTBEAT, str(count))
    except OSError:
        pass


class DriverWatch:
    """Rank 0's view of the heartbeat: alive while the counter moved within HEARTBEAT_STALE_S of rank 0's own clock."""

    def __init__(self, snapshots: Path):
        self.file, self.seen, self.moved = snapshots / HEARTBEAT, None, time.monotonic()

    def alive(self) -> bool:
        try:
            count = self.file.read_text(encoding="utf-8")
        except OSError:
            count = None
        if count != self.seen:
            self.seen, self.moved = count, time.monotonic()
        return count is not None and time.monotonic() - self.moved < HEARTBEAT_STALE_S


class StopAsked:
    """What a running evaluation polls (`is_set()`, as a threading.Event): the driver is shutting down, or rank 0
    asked to stop (the STOP file)."""

    def __init__(self, event, snapshots: Path):
        self.event, self.file = event, snapshots / STOP

    def is_set(self) -> bool:
        return self.event.is_set() or self.file.exists()
