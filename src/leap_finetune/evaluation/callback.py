"""Benchmarks during training (the `sync` mode): training pauses every N steps while the
benchmarks run; scores go to the metrics log and the enabled trackers at that step."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

from leap_finetune.evaluation.runner import print_summary, run_benchmarks


class BenchmarkCallback(TrainerCallback):
    def __init__(self, evals, benchmarks, renderer, run_dir: Path, console, every: int, processor=None):
        self.evals = evals
        self.processor = processor  # a vision-language model's, for rows with images
        self.benchmarks = benchmarks
        self.renderer = renderer
        self.predictions_dir = run_dir / "benchmarks"
        self.console = console
        self.every = every
        self.trainer = None  # set once the trainer exists
        self.last_step = None

    def evaluate(self, when: str) -> dict:
        trainer = self.trainer
        step = trainer.state.global_step
        if self.last_step == step:  # already evaluated at this step (e.g. the last step is also an eval step)
            return {}
        self.last_step = step
        results = run_benchmarks(trainer.model, self.renderer, self.evals, self.benchmarks,
                                 predictions_dir=self.predictions_dir, processor=self.processor)
        print_summary(self.console, results, step, when)
        trainer.log(dict(results))
        return results

    def on_step_end(self, args, state, control, **kwargs):
        # rank 0 only: the other ranks wait for it at the next step's gradient all-reduce
        if not state.is_world_process_zero:
            return
        if self.trainer is not None and state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.evaluate("during training")
