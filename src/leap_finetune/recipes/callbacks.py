"""Trainer callbacks every recipe uses: the metrics log, the progress bar, stopping on a signal
(checkpoint markers: recipes/checkpoints.py)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from transformers import TrainerCallback

from leap_finetune.files import write_atomic  # noqa: F401 - also imported from here
from leap_finetune.recipes.checkpoints import MARKER, _fsync_dir, checkpoints, delete, read_marker

class MetricsLog(TrainerCallback):
    """Appends one JSON object per log event to metrics.jsonl: step, loss, learning rate, eval
    loss, tokens/s (non-padding tokens seen since the previous log, per second)."""

    def __init__(self, path: Path):
        self.path = path
        self._last_time = None
        self._last_tokens = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self._last_time = time.perf_counter()
        self._last_tokens = state.num_input_tokens_seen or 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero:
            return
        record = {"step": state.global_step, "epoch": state.epoch}
        for key, value in logs.items():
            try:
                record[key] = float(value)  # Trainer logs some values as strings
            except (TypeError, ValueError):
                record[key] = value
        if "loss" in logs and self._last_time is not None:
            now = time.perf_counter()
            tokens = state.num_input_tokens_seen or 0
            elapsed = now - self._last_time
            if elapsed > 0 and tokens > self._last_tokens:
                record["tokens_per_second"] = (tokens - self._last_tokens) / elapsed
            self._last_time, self._last_tokens = now, tokens
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def on_evaluate(self, args, state, control, **kwargs):
        if state.global_step == 0:  # the baseline evaluation (eval_on_start) is not training time
            self._last_time = time.perf_counter()


class RichProgress(TrainerCallback):
    """One progress bar: step, loss (GRPO: the mean reward), tokens/s and ETA."""

    def __init__(self, console):
        self.console = console
        self.progress = None
        self.task = None
        self._start = None
        self._start_tokens = 0
        self._loss = math.nan

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"), TextColumn("{task.fields[speed]} tok/s"),
            TextColumn("ETA"), TimeRemainingColumn(), console=self.console, transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step,
                                           loss="loss -", speed="-")
        self._start = time.perf_counter()
        self._start_tokens = state.num_input_tokens_seen or 0

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is None:
            return
        elapsed = time.perf_counter() - self._start
        tokens = (state.num_input_tokens_seen or 0) - self._start_tokens
        speed = f"{tokens / elapsed:,.0f}" if elapsed > 0 and tokens > 0 else "-"
        self.progress.update(self.task, completed=state.global_step, speed=speed)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.progress is None or not logs:
            return
        if "reward" in logs and logs["reward"] is not None:
            self.progress.update(self.task, loss=f"reward {float(logs['reward']):.3f}")
        elif "loss" in logs:
            self.progress.update(self.task, loss=f"loss {float(logs['loss']):.4f}")
        if "eval_loss" in logs:
            self.progress.console.print(f"  step {state.global_step}: eval loss {float(logs['eval_loss']):.4f}")

    def on_evaluate(self, args, state, control, **kwargs):
        if self.progress is not None and state.global_step == 0:  # the baseline evaluation: not training speed
            self._start = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class StopOnSignal(TrainerCallback):
    """Ctrl-C or SIGTERM (a cluster pre-empting the job) finishes the current step, saves a
    complete checkpoint and stops, so `resume_from_checkpoint: latest` continues from there.
    A second signal exits at once."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def on_train_begin(self, args, state, control, **kwargs):
        import signal
        import threading

        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.SIGNALS:
            signum = getattr(signal, name)
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame):
        import time

        if self.received is not None:
            # The same signal again within a moment is one event delivered twice (SLURM and systemd signal
            # every process of the job, and the driver passes it on to a training process too): not a
            # request to stop at once.
            if signum == self.received and time.monotonic() - self._received_at < 2:
                return
            raise KeyboardInterrupt
        self.received, self._received_at = signum, time.monotonic()
        print(f"\nsignal {signum} received: saving a checkpoint after this step, then stopping "
              "(send it again to stop at once)", flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.received is not None:
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        import signal

        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


class CheckpointMarker(TrainerCallback):
    """Marks each checkpoint complete once the Trainer has written it, then rotates old ones.

    `keep`: the user's `save_total_limit` (None keeps all); `metrics`: the metrics log whose length is
    recorded; `seconds_before`: training time of the run before this process (a resume)."""

    def __init__(self, run_dir: Path, keep: int | None, seconds_before: float = 0.0):
        import time

        self.run_dir = run_dir
        self.keep = keep
        self.seconds_before = seconds_before
        self._started = time.perf_counter()

    def trained_seconds(self) -> float:
        import time

        return self.seconds_before + time.perf_counter() - self._started

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not folder.is_dir():
            return
        for path in folder.rglob("*"):  # the files' data first, then the manifest that vouches for them
            if path.is_file():
                with path.open("rb") as handle:
                    os.fsync(handle.fileno())
        metrics = self.run_dir / "metrics.jsonl"
        manifest = {
            "step": state.global_step,
            "files": {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*"))
                      if p.is_file() and p.name != MARKER},
            "metrics_bytes": metrics.stat().st_size if metrics.exists() else 0,
            "trained_seconds": round(self.trained_seconds(), 3),
        }
        write_atomic(folder / MARKER, json.dumps(manifest, indent=1))
        _fsync_dir(folder)
        self._rotate(state)

    def _rotate(self, state) -> None:
        if not self.keep:
            return
        complete = [p for p in checkpoints(self.run_dir) if read_marker(p) is not None]
        best = Path(state.best_model_checkpoint).name if state.best_model_checkpoint else None
        keep = complete[-self.keep:]
        if best and self.keep == 1 and all(p.name != best for p in keep):  # as transformers: best + newest
            keep = [p for p in complete if p.name == best] + keep
        for folder in complete:
            if folder not in keep and folder.name != best:
                delete(folder)
