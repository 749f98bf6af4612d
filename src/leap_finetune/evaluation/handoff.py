"""The hand-off of asynchronous evaluations between rank 0, which snapshots the model, and the driver, which starts
every process of the run (the evaluation server, the sbatch jobs): files in RUN/benchmarks/snapshots/, so it works
the same whether rank 0 is the driver's own process, a one-GPU child or a Ray Train worker.

  step-N/              a snapshot (model/, eval.yaml, snapshot.json), renamed into place when complete: a request
  step-N/claim         written once, by whoever decides the snapshot's fate first: `evaluate` (the driver starts
                       it) or `cancel` (rank 0 no longer wants it: skipped, or training ended) - never both
  step-N/outcome.json  the driver's answer: the results, or why the evaluation failed (and where its log is)
  STOP                 rank 0: stop the running evaluation (training stopped early, or past async_eval.wait_at_end_s)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from leap_finetune.evaluation.snapshot import Outcome, Snapshot
from leap_finetune.files import write_atomic

CLAIM = "claim"
OUTCOME = "outcome.json"
DESCRIPTION = "snapshot.json"
STOP = "STOP"


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
        except (OSError, ValueError):
            continue  # (being removed)
        found.append(Snapshot(described["step"], described["when"], folder, described.get("epoch")))
    return sorted(found, key=lambda s: s.step)


def claim(folder: Path, decision: str) -> bool:
    """Decide the snapshot's fate, if nobody has: True when this call decided (O_EXCL: one of the two sides
    wins, however close together they ask)."""
    try:
        handle = os.open(folder / CLAIM, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    except FileNotFoundError:
        return False  # (the snapshot is gone)
    with os.fdopen(handle, "w") as file:
        file.write(decision)
    return True


def answer(folder: Path, outcome: Outcome) -> None:
    try:
        write_atomic(
            folder / OUTCOME,
            json.dumps(
                {"results": outcome.results, "reason": outcome.reason, "log": str(outcome.log) if outcome.log else None}
            ),
        )
    except FileNotFoundError:
        pass  # rank 0 removed the snapshot meanwhile (training ended): nobody is waiting for this answer


def answered(folder: Path) -> Outcome | None:
    try:
        data = json.loads((folder / OUTCOME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Outcome(results=data["results"], reason=data["reason"], log=Path(data["log"]) if data["log"] else None)


def ask_to_stop(snapshots: Path) -> None:
    snapshots.mkdir(parents=True, exist_ok=True)
    (snapshots / STOP).touch()


class StopAsked:
    """What a running evaluation polls (`is_set()`, as a threading.Event): the driver is shutting down, or rank 0
    asked to stop (the STOP file)."""

    def __init__(self, event, snapshots: Path):
        self.event, self.file = event, snapshots / STOP

    def is_set(self) -> bool:
        return self.event.is_set() or self.file.exists()
