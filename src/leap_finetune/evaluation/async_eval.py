"""Benchmarks that do not pause training: `async_eval.mode: sidecar` (one SLURM job per evaluation) and
`reserved` (an evaluation server on GPUs the driver kept out of training).

At each evaluation point (the same as sync mode: before training unless resuming, every `eval_steps`, after
the last step) rank 0 writes a snapshot of the model - a full model folder, LoRA merged, into a temporary
folder renamed when complete, so a half-written snapshot is never evaluated - and hands it to the driver
(evaluation/handoff.py); training continues at once. The driver, which starts every process of the run
(launch/evaluator.py), runs `leap-finetune eval` on the snapshot (inside an sbatch job, or against the
respawned evaluation server) and writes the outcome beside it. Outcomes are taken in on rank 0 at the next
step end and logged keyed by the TRAINING STEP of the snapshot: metrics.jsonl and every tracker get the scores
at that step, RUN/benchmarks/results/step-N.json holds them, and the snapshot is deleted.

One evaluation runs at a time; `on_overlap` says whether one that falls due meanwhile waits (queue, at most
MAX_WAITING snapshots on disk) or is skipped. A failed evaluation (rejected sbatch, a job that fails, is
cancelled or times out, a server that does not start or dies) is counted like a failed sync evaluation
(evaluation/callback.py), and never stops training.
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.yaml_io import dump_yaml
from leap_finetune.errors import LeapError
from leap_finetune.evaluation import handoff
from leap_finetune.evaluation.callback import EvaluationLog
from leap_finetune.evaluation.reserved import use_vllm
from leap_finetune.evaluation.sidecar import check_sbatch_accepts
from leap_finetune.evaluation.snapshot import Snapshot, save_full_model
from leap_finetune.runs.atomic import replace_folder
from leap_finetune.runs.folder import MODEL, RunFolder

MAX_WAITING = 3  # snapshots waiting their turn (queue mode): bounded disk
POLL_S = 1.0
STOPPING_S = 120  # after STOP: how long the driver may take to stop the running evaluation and answer


def check_async_eval(resolved: ResolvedConfig, devices) -> None:
    """The machine-dependent checks (validate and run): sbatch for sidecar; one node, and the server's
    packages, for reserved. `devices`: the device plan (launch/devices.py)."""
    mode = resolved.async_eval.mode if resolved.async_eval is not None else "sync"
    where = f"{resolved.config_path or 'config'}: async_eval.mode"
    if mode == "sidecar" and shutil.which("sbatch") is None:
        raise LeapError(
            "async_eval.mode sidecar submits each evaluation with sbatch, which is not installed here",
            where=where,
            fix="run on a SLURM cluster's node (where sbatch works), or use mode: reserved "
            "(a GPU of this machine) or sync",
        )
    if mode == "sidecar":
        check_sbatch_accepts(resolved, where)
    if mode != "reserved":
        return
    if devices.address:
        raise LeapError(
            f"async_eval.mode reserved runs the evaluation server on GPUs of the driver's machine, and "
            f"this run trains on the Ray cluster at {devices.address}",
            where=where,
            fix="use mode: sidecar on a cluster, or run on one machine without ray.address",
        )
    from leap_finetune.runs.processes import port_in_use

    port = resolved.async_eval.reserved.server_port
    if port_in_use("127.0.0.1", port):
        raise LeapError(
            f"port {port} is in use by another process: the evaluation server could not start there",
            where=f"{resolved.config_path or 'config'}: async_eval.reserved.server_port",
            fix="stop what listens there, or choose another server_port",
        )
    if devices.nodes > 1:
        raise LeapError(
            f"async_eval.mode reserved runs the evaluation server on one node, and this run spans "
            f"{devices.nodes} nodes",
            where=where,
            fix="use mode: sidecar for multi-node training",
        )
    if not use_vllm(resolved):
        import importlib.util

        missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
        if missing:
            raise LeapError(
                f"the reserved evaluation server (leap-finetune's own; vLLM is not installed) needs "
                f"{', '.join(missing)}",
                where=where,
                fix="pip install 'leap-finetune[serve]' (or vllm)",
            )


class AsyncBenchmarks(EvaluationLog):
    """The callback of sidecar and reserved mode (rank 0 takes the snapshots and the outcomes; the driver runs
    the evaluations)."""

    def __init__(self, resolved: ResolvedConfig, run_dir: Path, console, every: int, template_text: str):
        super().__init__(run_dir, console, every, resolved.async_eval.failure.max_consecutive)
        self.resolved = resolved
        self.settings = resolved.async_eval
        self.template_text = template_text  # the chat template the benchmarks render with (saved with snapshots)
        self.snapshots = RunFolder(run_dir).snapshots
        self.pending: list[Snapshot] = []  # handed to the driver, in order; the first may be running
        self.finished: dict[int, dict] = {}
        self.epoch: float | None = None  # the epoch of the snapshot whose outcome is being logged
        self.training_ended = False
        self.processor = None  # a vision-language model's, saved with each snapshot (loaded at the first)
        self.processor_loaded = False
        self.handed: dict[int, float] = {}  # step -> when its snapshot was handed over (time.monotonic)
        self.training_between: float | None = None  # seconds of training between the last two snapshots
        self.said_slow = False

    # -- taking snapshots ------------------------------------------------------------------------------------
    def evaluate(self, when: str) -> dict:
        trainer = self.trainer
        step = trainer.state.global_step
        self.take_outcomes()
        if self.last_step == step or self.switched_off:
            return {}
        self.last_step = step
        busy = [p for p in self.pending if handoff.answered(p.folder) is None]
        final = when == "after training"
        if busy and not final and (self.settings.on_overlap == "skip" or len(busy) > MAX_WAITING):
            why = "on_overlap: skip" if self.settings.on_overlap == "skip" else f"{MAX_WAITING} snapshots already wait"
            self.console.print(
                f"[yellow]evaluation of step {step} skipped: the evaluation of step "
                f"{busy[0].step} still runs ({why})[/yellow]"
            )
            return {}
        try:
            snapshot = self._snapshot(step, when)
        except Exception as err:  # noqa: BLE001 - a full disk while snapshotting must not stop training
            shutil.rmtree(self.snapshots / f".step-{step}.partial", ignore_errors=True)
            self._failed(step, when, f"{type(err).__name__}: {err}", None, err)
            return {}
        self.pending.append(snapshot)
        now = time.monotonic()
        if self.handed and not final:
            self.training_between = now - max(self.handed.values())
        self.handed[step] = now
        self.console.print(
            f"evaluation of step {step} ({when}) handed to the {self.settings.mode} evaluator"
            + (f"; {len(busy)} evaluation(s) ahead of it" if busy else "")
        )
        return {}

    def _snapshot(self, step: int, when: str) -> Snapshot:
        """RUN/benchmarks/snapshots/step-N: model/ and eval.yaml, renamed into place when complete."""
        final = self.snapshots / f"step-{step}"
        evals = self.resolved.evals.model_dump(mode="json", exclude_none=True)
        config = {
            "project_name": f"{self.resolved.project_name}-eval",
            "model_name": self.resolved.model_id,
            "chat_template": self.resolved.chat_template,
            "checkpoint": str(final),
            "evals": evals,
        }

        snapshot = Snapshot(step, when, final, self.trainer.state.epoch)

        def write(staging: Path) -> None:
            staging.mkdir(parents=True)
            save_full_model(self.trainer, staging / MODEL, self.template_text, self._processor())
            (staging / "eval.yaml").write_text(dump_yaml(config), encoding="utf-8")
            handoff.describe(Snapshot(step, when, staging, snapshot.epoch))  # (last: the request is complete)

        replace_folder(final, write)
        return snapshot

    def _processor(self):
        """A vision-language model's processor, for the snapshots: an evaluation server (vLLM or ours) reads
        the image settings from the model folder. Without torchvision it cannot load: the snapshot is saved
        without it (image benchmarks needed torchvision at validate already)."""
        if not self.processor_loaded:
            self.processor_loaded = True
            from leap_finetune.models.vision import is_vision_model, load_processor

            if is_vision_model(self.resolved.model_id):
                tokenizer = self.trainer.processing_class
                tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
                # the config's image_processor: settings, where the config has them (as the final model's)
                image_settings = getattr(self.resolved, "image_processor", None)
                settings = image_settings.settings() if image_settings is not None else None
                try:
                    self.processor = (
                        load_processor(self.resolved.model_id, tokenizer, settings)
                        if settings
                        else load_processor(self.resolved.model_id, tokenizer)
                    )
                except LeapError as err:
                    self.console.print(f"note: snapshots are saved without the image processor ({err.message})")
        return self.processor

    # -- taking outcomes (rank 0, between steps) -------------------------------------------------------------
    def take_outcomes(self) -> None:
        while self.pending and (outcome := handoff.answered(self.pending[0].folder)) is not None:
            snapshot = self.pending.pop(0)
            self.epoch = snapshot.epoch
            if outcome.results is not None:
                self._succeeded(snapshot, outcome.results, outcome.seconds)
            elif not self.switched_off:
                self._failed(snapshot.step, snapshot.when, outcome.reason, outcome.log)
            handoff.remove(snapshot.folder)
        if self.switched_off:
            self._cancel_waiting()

    def _say_if_slower_than_training(self, step: int, took: float | None) -> None:
        """Once per run: an evaluation that took longer (by itself: not its wait in the queue, nor a server's start)
        than the training between two evaluations - they queue up behind training (or are skipped) and the end of
        the run waits for them."""
        between = self.training_between
        if self.said_slow or took is None or between is None or took <= between:
            return
        self.said_slow = True
        reload = (
            ", or `async_eval.reserved.weight_reload: in_place` (no server start per evaluation)"
            if self.settings.mode == "reserved" and self.settings.reserved.weight_reload == "respawn"
            else ""
        )
        self.console.print(
            f"[yellow]the evaluation of step {step} took {took:.0f} s, longer than the {between:.0f} s of training "
            f"between two evaluations: evaluations wait behind each other (on_overlap: "
            f"{self.settings.on_overlap}) and the run's end waits for them. Evaluate less often (a larger "
            f"evals.eval_steps) or fewer rows{reload}.[/yellow]"
        )

    def _succeeded(self, snapshot: Snapshot, results: dict, seconds: float | None = None) -> None:
        self._say_if_slower_than_training(snapshot.step, seconds)
        self.failures_in_a_row = 0
        self.finished[snapshot.step] = results
        current = self.trainer.state.global_step
        late = (
            ", arrived after training"
            if self.training_ended and current != snapshot.step
            else f", arrived at step {current}"
            if current != snapshot.step
            else ""
        )
        from leap_finetune.evaluation.runner import print_summary

        print_summary(
            self.console, results, None, f"of step {snapshot.step} ({snapshot.when}; {self.settings.mode}{late})"
        )
        self.log_at(snapshot.step, dict(results))
        self.write_results(snapshot.step, snapshot.when, results)
        from leap_finetune.evaluation.standalone import predictions_dir

        # the newest evaluation's (`eval --output results.json` wrote them beside its results)
        for predictions in predictions_dir(snapshot.folder / "results.json").glob("*.jsonl"):
            os.replace(predictions, self.predictions_dir / predictions.name)

    def log_at(self, step: int, logs: dict) -> None:
        """Log to metrics.jsonl and every tracker at training step `step` (the snapshot's), not at the step
        the results arrived: the callbacks get the trainer's state with that step."""
        trainer = self.trainer
        state = copy.copy(trainer.state)
        state.global_step, state.epoch = step, self.epoch
        trainer.state.log_history.append({**logs, "step": step})
        trainer.callback_handler.on_log(trainer.args, state, trainer.control, logs)

    def _cancel_waiting(self) -> None:
        """Snapshots the driver has not started: taken back (a claim the driver can no longer make)."""
        for snapshot in list(self.pending):
            if handoff.claim(snapshot.folder, "cancel"):
                self.pending.remove(snapshot)
                handoff.remove(snapshot.folder)

    # -- the end -----------------------------------------------------------------------------------------------
    def finish(self, *, wait: bool) -> dict[int, dict]:
        """After training: wait (at most wait_at_end_s) for the evaluations still running and log their
        results; stopped early (or past the wait), stop them. Returns every evaluation's results by step."""
        self.training_ended = True
        if wait and self.pending:
            left = [s.step for s in self.pending]
            self.console.print(
                f"waiting for {len(left)} evaluation(s) still running or queued (steps "
                f"{', '.join(map(str, left))}; at most {self.settings.wait_at_end_s:g} s)"
            )
            deadline = time.monotonic() + self.settings.wait_at_end_s
            driver = handoff.DriverWatch(self.snapshots)
            while self.pending and time.monotonic() < deadline:
                self.take_outcomes()
                if self.pending and not driver.alive():
                    self.console.print(
                        "[yellow]the driver's evaluator stopped answering (see the run's output): "
                        "not waiting for it[/yellow]"
                    )
                    break
                time.sleep(POLL_S / 2)
        self.take_outcomes()
        if self.pending:
            handoff.ask_to_stop(self.snapshots)
            steps = ", ".join(str(s.step) for s in self.pending)
            self.console.print(
                f"[yellow]evaluations of step(s) {steps} stopped unfinished "
                + (
                    "(training stopped early)"
                    if not wait
                    else f"(past async_eval.wait_at_end_s = {self.settings.wait_at_end_s:g} s)"
                )
                + "[/yellow]"
            )
            self._cancel_waiting()
            # the running one: the driver stops its job or server, then answers (a stopped evaluation: not logged)
            deadline = time.monotonic() + STOPPING_S
            while self.pending and handoff.answered(self.pending[0].folder) is None and time.monotonic() < deadline:
                time.sleep(POLL_S / 2)
        self.pending.clear()
        for folder in self.snapshots.glob("step-*"):  # (STOP stays for the driver, which removes the folder)
            handoff.remove(folder)
        return self.finished

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run (the checkpoint's weights and step are loaded by now): evaluations that had not reported
        when the run stopped lost their snapshots - said, not silent; the checkpoint's own step, if an evaluation
        was due there, is evaluated again now."""
        step = state.global_step
        if not state.is_world_process_zero or self.trainer is None or step == 0:
            return None
        done = {int(p.stem.split("-")[1]) for p in self.results_dir.glob("step-*.json")}
        lost = [s for s in range(0, step, self.every) if s not in done]
        if lost:
            self.console.print(
                f"note: evaluation(s) of step(s) {', '.join(map(str, lost))} have no results (failed, or "
                "not finished when the run stopped; their snapshots are gone): not evaluated"
            )
        if step % self.every == 0 and step not in done and step < state.max_steps:
            self.evaluate("at the resumed checkpoint")
        return None

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or self.trainer is None:
            return None
        self.take_outcomes()
        if state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.evaluate("during training")
        return None
