"""The driver's plan: where the run lives and which checkpoint it resumes from."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.errors import LeapError
from leap_finetune.recipes.callbacks import CHECKPOINT_COMPLETE

OUTPUTS_ROOT = Path("outputs")


@dataclass
class RunPlan:
    run_dir: Path
    run_name: str
    resume_checkpoint: Path | None
    new_run: bool


def plan_run(resolved: ResolvedConfig, *, outputs_root: Path | None = None) -> RunPlan:
    root = (outputs_root or OUTPUTS_ROOT).resolve() / resolved.project_name
    resume = resolved.resume_from_checkpoint
    if resume == "latest":
        checkpoint = latest_checkpoint(Path(resolved.output_dir) if resolved.output_dir else root)
        if checkpoint is None:
            raise LeapError(
                f"resume_from_checkpoint: latest, but no complete checkpoint exists under {resolved.output_dir or root}",
                where="training_config.resume_from_checkpoint",
                fix="remove resume_from_checkpoint to start a new run, or point it at a checkpoint folder",
            )
        return RunPlan(checkpoint.parent, checkpoint.parent.name, checkpoint, new_run=False)
    if resume:
        checkpoint = Path(resume)
        if not (checkpoint / CHECKPOINT_COMPLETE).exists() and not (checkpoint / "trainer_state.json").exists():
            raise LeapError(
                "not a complete checkpoint folder (no trainer_state.json)",
                where=f"training_config.resume_from_checkpoint: {resume}",
                fix="use a checkpoint-N folder of an earlier run, or `latest`",
            )
        return RunPlan(checkpoint.parent, checkpoint.parent.name, checkpoint, new_run=False)
    if resolved.output_dir:
        run_dir = Path(resolved.output_dir)
        return RunPlan(run_dir, run_dir.name, None, new_run=True)
    run_name = resolved.training.get("run_name") or f"{resolved.training_type}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = root / run_name
    suffix = 1
    while run_dir.exists():  # two runs started in the same second
        suffix += 1
        run_dir = root / f"{run_name}-{suffix}"
    return RunPlan(run_dir, run_dir.name, None, new_run=True)


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint in a run folder, or in the newest run of a project folder."""
    if not folder.exists():
        return None
    candidates = list(folder.glob(f"checkpoint-*/{CHECKPOINT_COMPLETE}")) + list(
        folder.glob(f"*/checkpoint-*/{CHECKPOINT_COMPLETE}")
    )
    if not candidates:
        return None

    def key(marker: Path):
        run = marker.parent.parent
        step = int(re.sub(r"\D", "", marker.parent.name.split("-")[-1]) or 0)
        return (run.stat().st_mtime if run != folder else 0, step)

    # Newest run first (by the time its last checkpoint was written), then highest step.
    by_run: dict[Path, list[Path]] = {}
    for marker in candidates:
        by_run.setdefault(marker.parent.parent, []).append(marker)
    newest_run = max(by_run, key=lambda run: max(m.stat().st_mtime for m in by_run[run]))
    return max(by_run[newest_run], key=key).parent
