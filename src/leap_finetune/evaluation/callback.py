"""Benchmarks during training. In `sync` mode training pauses every N steps while the benchmarks run; scores
go to the metrics log and the enabled trackers at that step (sidecar and reserved: evaluation/async_eval.py).

A failed evaluation (an exception in a benchmark, out of memory) never stops training: it is logged with its
reason and its traceback file, and after `async_eval.failure.max_consecutive` failures in a row evaluation is
switched off for the rest of the run."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

from leap_finetune.evaluation.runner import print_summary, run_benchmarks
from leap_finetune.runs.folder import RunFolder


class EvaluationLog(TrainerCallback):
    """What every mode shares: results kept per training step, failures counted, evaluation switched off after
    `max_failures` in a row. `trainer` is set once the trainer exists (rank 0 evaluates)."""

    def __init__(self, run_dir: Path, console, every: int, max_failures: int):
        self.predictions_dir = RunFolder(run_dir).benchmarks
        self.results_dir = RunFolder(run_dir).benchmark_results
        self.console = console
        self.every = every
        self.trainer = None
        self.last_step = None
        self.max_failures = max_failures
        self.failures_in_a_row = 0
        self.failures = 0
        self.switched_off = False

    def log_at(self, step: int, logs: dict) -> None:
        self.trainer.log(logs)  # sync: the trainer is at that step

    def finish(self, *, wait: bool) -> dict[int, dict] | None:
        """Async modes: the results of evaluations still running (see async_eval.py); sync: nothing waits."""
        return None

    def write_results(self, step: int, when: str, results: dict) -> None:
        """RUN/benchmarks/results/step-N.json: the scores of the evaluation of training step N (the same file
        whichever mode evaluated it), written whole or not at all."""
        import json

        from leap_finetune.files import write_atomic

        folder = self.results_dir
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(
            folder / f"step-{step}.json", json.dumps({"step": step, "when": when, "results": results}, indent=2)
        )

    def _failed(self, step: int, when: str, reason: str, log: Path | None, err: BaseException | None = None) -> None:
        import traceback

        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # an out-of-memory evaluation leaves its blocks cached
        self.failures += 1
        self.failures_in_a_row += 1
        if err is not None:  # an exception in this process: its traceback is the log
            log = self.predictions_dir / "failures" / f"step-{step}.txt"
            try:
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text("".join(traceback.format_exception(err)), encoding="utf-8")
            except OSError:
                log = None
        where = f" (log: {log})" if log is not None else ""
        self.console.print(
            f"[yellow]evaluation at step {step} ({when}) failed: {reason}{where}; training goes on "
            f"({self.failures_in_a_row} failure(s) in a row of {self.max_failures} allowed)[/yellow]"
        )
        self.log_at(step, {"benchmark/failures": float(self.failures)})
        if self.failures_in_a_row >= self.max_failures:
            self.switched_off = True
            self.console.print(
                f"[yellow]evaluation switched off for the rest of the run after {self.failures_in_a_row} "
                "failed evaluations in a row (async_eval.failure.max_consecutive); training goes "
                "on[/yellow]"
            )


class BenchmarkCallback(EvaluationLog):
    """Sync mode: the benchmarks run in the training process (rank 0) while training waits."""

    def __init__(
        self, evals, benchmarks, renderer, run_dir: Path, console, every: int, processor=None, max_failures: int = 3
    ):
        super().__init__(run_dir, console, every, max_failures)
        self.evals = evals
        self.processor = processor  # a vision-language model's, for rows with images
        self.benchmarks = benchmarks
        self.renderer = renderer
        self.best = None  # the benchmark metric_for_best_model names (its score chooses the best checkpoint)
        self.latest = None  # that benchmark's newest score

    def evaluate(self, when: str) -> dict:
        trainer = self.trainer
        step = trainer.state.global_step
        if self.last_step == step:  # already evaluated at this step (e.g. the last step is also an eval step)
            return {}
        self.last_step = step
        if self.switched_off:
            return {}
        try:
            results = run_benchmarks(
                trainer.model,
                self.renderer,
                self.evals,
                self.benchmarks,
                predictions_dir=self.predictions_dir,
                processor=self.processor,
            )
        except Exception as err:  # noqa: BLE001 - an evaluation must never stop training
            self._failed(step, when, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", None, err)
            return {}
        self.failures_in_a_row = 0
        print_summary(self.console, results, step, when)
        trainer.log(dict(results))
        self.write_results(step, when, results)
        if self.best is not None and step > 0:  # (before training is the base model's score, no checkpoint's)
            self._track_best(step, results.get(f"benchmark/{self.best}/score"))
        return results

    def _track_best(self, step: int, score: float | None) -> None:
        """The Trainer's own best-checkpoint bookkeeping (as its _determine_best_metric does for eval metrics): the
        best score and its step; the checkpoint of that step is the best one once it is saved (transformers
        notes it at the save; one already on disk - the final evaluation's step - is noted here)."""
        if score is None:
            return
        self.latest = score
        state, args = self.trainer.state, self.trainer.args
        better = state.best_metric is None or (
            score > state.best_metric if args.greater_is_better else score < state.best_metric
        )
        if better:
            state.best_metric, state.best_global_step = score, step
            folder = Path(args.output_dir) / f"checkpoint-{step}"
            if folder.is_dir():
                state.best_model_checkpoint = str(folder)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        """The Trainer's evaluation chooses the best checkpoint by metric_for_best_model: the benchmark's score at
        this step goes into its metrics (evaluated now if this step's benchmarks have not run)."""
        if self.best is None or metrics is None:
            return
        # (rank 0 evaluates and chooses; the other ranks get a score that is never the best, for the Trainer's
        # bookkeeping that runs on every rank)
        benchmark_step = state.global_step % self.every == 0 or state.global_step >= state.max_steps
        if benchmark_step and state.is_world_process_zero and self.trainer is not None:
            if self.last_step != state.global_step:
                self.evaluate("during training")
        key = "eval_" + str(args.metric_for_best_model).removeprefix("eval_")
        worst = float("-inf") if args.greater_is_better else float("inf")  # (no score here: never the best)
        # (only a benchmark step's own score: a step between them has no checkpoint validate made sure of)
        scored = benchmark_step and self.last_step == state.global_step and state.is_world_process_zero
        metrics[key] = self.latest if scored and self.latest is not None else worst

    def on_step_end(self, args, state, control, **kwargs):
        # rank 0 only: the other ranks wait for it at the next step's gradient all-reduce
        if not state.is_world_process_zero:
            return
        if self.trainer is not None and state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.evaluate("during training")
        return None
