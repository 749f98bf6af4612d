"""Trainer callbacks every recipe uses: the metrics log, the progress bar, stopping on a signal
(checkpoint markers: runs/checkpoints.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from transformers import TrainerCallback

from leap_finetune import faults
from leap_finetune.files import write_atomic  # noqa: F401 - also imported from here
from leap_finetune.runs.checkpoints import (
    DIGEST_LIMIT,
    MARKER,
    _fsync_dir,
    checkpoints,
    delete,
    file_digest,
    read_marker,
)
from leap_finetune.runs.folder import RunFolder


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


class RouterMetrics(TrainerCallback):
    """A mixture-of-experts model's router metrics since the previous log (models/moe_router.py), added to the
    training log before MetricsLog writes it: aux loss, z-loss, expert load min/max/entropy. Rank 0's own batches
    (each worker routes its own)."""

    def __init__(self):
        self._stats = None

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if logs is None or "loss" not in logs or model is None:
            return
        if self._stats is None:
            self._stats = next(
                (m._leap_router_stats for m in model.modules() if hasattr(m, "_leap_router_stats")), False
            )
        if self._stats:
            logs.update(self._stats.read() or {})


class QatSwitch(TrainerCallback):
    """qat.start_step: the quantized forward from that step on (a resume past it starts with it on)."""

    def __init__(self, state):
        self.qat = state

    def on_train_begin(self, args, state, control, **kwargs):
        self.qat.active = state.global_step >= self.qat.start_step

    def on_step_begin(self, args, state, control, **kwargs):
        self.qat.active = state.global_step >= self.qat.start_step


class RichProgress(TrainerCallback):
    """One progress bar: step, loss (GRPO: the mean reward), tokens/s and ETA."""

    def __init__(self, console):
        self.console = console
        self.progress = None
        self.task = None
        self._start = None
        self._start_tokens = 0
        self._shown = False  # (a loss or a reward was shown: the run's mean loss at the end would replace it)

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            TextColumn("[bold]training"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"),
            TextColumn("{task.fields[speed]} tok/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.progress.start()
        self.task = self.progress.add_task(
            "train", total=state.max_steps, completed=state.global_step, loss="loss -", speed="-"
        )
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
            failed = logs.get("judge/failures")
            judge = f" (judge failed {float(failed):g}/{float(logs.get('judge/requests') or 0):g})" if failed else ""
            self.progress.update(self.task, loss=f"reward {float(logs['reward']):.3f}{judge}")
            self._shown = True
        elif "loss" in logs:
            self.progress.update(self.task, loss=f"loss {float(logs['loss']):.4f}")
            self._shown = True
        elif "train_loss" in logs and not self._shown:  # (logging_steps past the last step: the run's mean)
            mean = round(float(logs["train_loss"]), 4) + 0.0  # (no "-0.0000")
            self.progress.update(self.task, loss=f"mean loss {mean:.4f}")
        if "eval_loss" in logs:
            loss = round(float(logs["eval_loss"]), 4) + 0.0  # (no "-0.0000" for a divergence of -1e-7)
            self.progress.console.print(f"  step {state.global_step}: eval loss {loss:.4f}")

    def on_evaluate(self, args, state, control, **kwargs):
        if self.progress is not None and state.global_step == 0:  # the baseline evaluation: not training speed
            self._start = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class AlreadyTrained(Exception):
    """Raised by FinishOnly: the resumed checkpoint is the run's last step."""


class FinishOnly(TrainerCallback):
    """A resume from the run's last step (the run was interrupted between its final checkpoint and the end:
    final evaluation, saving the model) has nothing left to train. transformers would train one step more
    (its loop checks max_steps only after a step; measured: step 17 of 16, final weights that differ from the
    uninterrupted run's), so training ends here, with the checkpoint's weights, optimizer and state loaded,
    and the run only finishes (recipes/common.train_or_finish)."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            raise AlreadyTrained


class ResumeChanges(TrainerCallback):
    """Settings a resume changes (`resume_allow_changes`) apply from the resumed step on, including the first.

    The checkpoint's optimizer and scheduler states carry the old values: the optimizer's groups keep their
    learning rate, betas, epsilon and weight decay, the scheduler its base learning rates, and the first
    resumed step uses the learning rate the old schedule computed (measured: a changed learning_rate was
    ignored, a changed lr_scheduler_type took effect one step late). After the states are loaded, the new
    values are put in their place and the learning rate of the resumed step is computed by the new schedule.
    Settings TRL reads at every step (max_grad_norm, beta, temperature, ...) apply by themselves."""

    SCHEDULE = ("learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio")

    def __init__(self, changes: dict):
        self.changes = {k.removeprefix("training_config."): v for k, v in (changes or {}).items()}

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if not self.changes or state.global_step == 0 or optimizer is None:
            return
        keys = set(self.changes)
        groups = optimizer.param_groups
        if "weight_decay" in keys:
            # transformers' optimizer: group 0 decays, group 1 (biases, norms) never does
            for group in groups[:1] if len(groups) == 2 else [g for g in groups if g.get("weight_decay")]:
                group["weight_decay"] = args.weight_decay
        for group in groups:
            if keys & {"adam_beta1", "adam_beta2"} and "betas" in group:
                group["betas"] = (args.adam_beta1, args.adam_beta2)
            if "adam_epsilon" in keys and "eps" in group:
                group["eps"] = args.adam_epsilon
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # (accelerate wraps it)
        if not keys & set(self.SCHEDULE) or scheduler is None or not hasattr(scheduler, "lr_lambdas"):
            return
        if "learning_rate" in keys and scheduler.base_lrs and scheduler.base_lrs[0]:
            before = scheduler.base_lrs[0]  # (the checkpoint's: groups keep their ratios to it)
            scheduler.base_lrs = [base * args.learning_rate / before for base in scheduler.base_lrs]
        lrs = [base * factor(scheduler.last_epoch) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
        for group, base, lr in zip(optimizer.param_groups, scheduler.base_lrs, lrs):
            group["lr"], group["initial_lr"] = lr, base
        scheduler._last_lr = lrs


class StopOnSignal(TrainerCallback):
    """Ctrl-C or SIGTERM (a cluster pre-empting the job) finishes the current step, saves a complete
    checkpoint and stops, so `resume_from_checkpoint: latest` continues from there; a second signal stops at
    once (leap_finetune/signals.py holds the handlers, for every phase of the run).

    The request comes from this process's own signal handler, or - Ray workers, which the driver's signals do
    not reach - from the stop request the driver writes in the run folder (read by rank 0). `reasons` are other
    checks that stop the run the same way (a judge that stays down). Several processes agree through one
    all-reduce per step, so every rank stops after the same step and saves it together; a run folder deleted
    under the run is an error on every rank. (Several processes: one small all-reduce per step, which waits for
    the GPU - the one host sync left in a multi-GPU step; a single process reads nothing from the GPU here.)"""

    def __init__(self):
        self.received: int | None = None
        self.stopped_by_reason = False
        self.reasons: list = []  # callables -> bool, checked on every rank after every step

    def on_train_begin(self, args, state, control, **kwargs):
        from leap_finetune import signals

        signals.enter("training")

    def on_step_end(self, args, state, control, **kwargs):
        from leap_finetune import signals

        flag = signals.received() or 0
        if not flag and state.is_world_process_zero:
            flag = signals.read_request(args.output_dir) or 0
        gone = int(state.is_world_process_zero and not os.path.isdir(args.output_dir))
        other = int(any(check() for check in self.reasons))
        flag, gone, other = _agreed([flag, gone, other], args)
        if gone:
            from leap_finetune.errors import LeapError

            raise LeapError(
                f"the run folder was deleted while the run was training (at step {state.global_step}): "
                "nothing more can be saved",
                where=args.output_dir,
                fix="start the run again (nothing of it is left to resume)",
            )
        if flag or other:
            self.received = flag or None
            self.stopped_by_reason = bool(other and not flag)
            control.should_save = True
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        from leap_finetune import signals

        signals.enter("finishing")


def _agreed(flags: list[int], args) -> list[int]:
    """The largest value of each flag over every process of a distributed run (this one's alone otherwise)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flags
    import torch

    value = torch.tensor(flags, dtype=torch.int64, device=args.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return [int(v) for v in value.tolist()]


class CheckpointMarker(TrainerCallback):
    """Marks each checkpoint complete once the Trainer has written it, then rotates old ones.

    `keep`: the user's `save_total_limit` (None keeps all); `metrics`: the metrics log whose length is
    recorded; `seconds_before`: training time of the run before this process (a resume)."""

    def __init__(self, run_dir: Path, keep: int | None, seconds_before: float = 0.0, record: dict | None = None):
        import time

        self.run_dir = run_dir
        self.keep = keep
        self.seconds_before = seconds_before
        self.record = record or {}  # the run's config and data fingerprint: what a resume from here is checked against
        self._started = time.perf_counter()

    def trained_seconds(self) -> float:
        import time

        return self.seconds_before + time.perf_counter() - self._started

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        folder = RunFolder(args.output_dir).checkpoint(state.global_step)
        if not folder.is_dir():
            return
        for path in folder.rglob("*"):  # the files' data first, then the manifest that vouches for them
            if path.is_file():
                with path.open("rb") as handle:
                    os.fsync(handle.fileno())
        metrics = RunFolder(self.run_dir).metrics
        files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MARKER]
        manifest = {
            "step": state.global_step,
            "files": {str(p.relative_to(folder)): p.stat().st_size for p in files},
            # a changed byte is caught where reading the file again is cheap (the states, configs, the weights
            # of small models); the big files (optimizer, large weights) by their size
            "sha256": {str(p.relative_to(folder)): file_digest(p) for p in files if p.stat().st_size <= DIGEST_LIMIT},
            "metrics_bytes": metrics.stat().st_size if metrics.exists() else 0,
            "trained_seconds": round(self.trained_seconds(), 3),
            "saved_at": time.time(),  # (`latest` orders runs by this, not by file times: clocks of other hosts)
            **self.record,
        }
        faults.point("checkpoint-written")
        write_atomic(folder / MARKER, json.dumps(manifest, indent=1))
        _fsync_dir(folder)
        self._rotate(state)
        faults.point("checkpoint-saved")

    def _rotate(self, state) -> None:
        if not self.keep:
            return
        complete = [p for p in checkpoints(self.run_dir) if read_marker(p) is not None]
        best = Path(state.best_model_checkpoint).name if state.best_model_checkpoint else None
        keep = complete[-self.keep :]
        if best and self.keep == 1 and all(p.name != best for p in keep):  # as transformers: best + newest
            keep = [p for p in complete if p.name == best] + keep
        for folder in complete:
            if folder not in keep and folder.name != best:
                delete(folder)
