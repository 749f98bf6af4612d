"""The model in a folder: one answer for `chat`, `export`, `eval` (`checkpoint:`) and `model_name: ./outputs/...`.

A folder given by the user may be the model itself (config.json), a LoRA adapter (adapter_config.json), a run
folder (its final model/, else its adapter/, else its newest intact checkpoint) or a project folder of runs
(the same, in its newest run: the one with the newest checkpoint, else the one that finished last).
"""

from __future__ import annotations

import json
from pathlib import Path

from leap_finetune.runs.checkpoints import latest_checkpoint, newest_run
from leap_finetune.runs.folder import RunFolder


def is_model(folder: Path) -> bool:
    return (Path(folder) / "config.json").exists()


def is_adapter(folder: Path) -> bool:
    return (Path(folder) / "adapter_config.json").exists()


def finished_model(folder: Path) -> Path | None:
    """The final model of a run folder (its `model/`) or, for a project folder (`outputs/PROJECT`), of its newest
    finished run - so that one run can start from another's result without naming its timestamped folder
    (`model_name: ./outputs/grpo-tiny-warmup`). None when `folder` is itself a model or holds no finished run."""
    folder = Path(folder)
    if not folder.is_dir() or is_model(folder):
        return None
    if is_model(RunFolder(folder).model):
        return RunFolder(folder).model
    finished = []
    for run in folder.iterdir():
        summary = RunFolder(run).summary  # written when a run ends, after its model
        if run.is_dir() and summary.exists() and is_model(RunFolder(run).model):
            finished.append((_finished_at(summary), run.name, RunFolder(run).model))
    return max(finished)[2] if finished else None


def model_in(folder: Path) -> Path | None:
    """The folder holding the model to load (a model or an adapter folder, or a checkpoint); None if there is none."""
    folder = Path(folder)
    if is_model(folder) or is_adapter(folder):
        return folder
    # the run with the newest checkpoint; else (runs that save none) the newest finished run
    run = newest_run(folder) or (finished.parent if (finished := finished_model(folder)) else folder)
    for candidate in (RunFolder(run).model, RunFolder(run).adapter, RunFolder(folder).model, RunFolder(folder).adapter):
        if is_model(candidate) or is_adapter(candidate):
            return candidate
    return latest_checkpoint(folder)


def _finished_at(summary: Path) -> float:
    """When the run finished, by the clock of the process that ran it (a file's time comes from whichever host
    wrote it: clock skew between hosts would pick the wrong run); summaries without it: the file's time."""
    try:
        recorded = json.loads(summary.read_text(encoding="utf-8")).get("finished_at")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return float(recorded) if isinstance(recorded, (int, float)) else summary.stat().st_mtime
