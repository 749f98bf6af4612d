"""The run's summary.json, written by rank 0 at the end of a run (or when it stops early): steps, the training loss
over the whole run (resumes included), the time trained, the tokens seen, the evaluation and benchmark results
before and after training, GRPO's rewards. It is also what `train` returns: the end report and the model card
read it, a resume checks whether the run already ended (launch/plan.py), runs/model.py which run finished last."""

from __future__ import annotations

import json
import time
from pathlib import Path

from leap_finetune.config.communication import gradient_all_reduce
from leap_finetune.files import write_atomic
from leap_finetune.runs.folder import RunFolder

# The benchmark results of the run's summary, end report and model card: each score, and a tool_call benchmark's
# sub-scores (its score is the exact-call accuracy; evaluation/runner.py)
SUMMARY_BENCHMARK_KEYS = ("/score", "/name", "/argument_f1", "/parsed", "/no_call")


def metrics_history(path: Path) -> dict:
    """From metrics.jsonl: the mean training loss per step over the run (each logged loss is the mean
    of the steps since the previous log), and the step-0 evaluation and benchmark results."""
    from leap_finetune.files import read_metrics

    records = read_metrics(path)
    total, steps, previous = 0.0, 0, 0
    for record in records:
        if "loss" in record and is_number(record["loss"]) and record.get("step", 0) > previous:
            span = record["step"] - previous
            total += float(record["loss"]) * span
            steps += span
            previous = record["step"]
    rewards = [float(r["reward"]) for r in records if "reward" in r and is_number(r["reward"])]
    initial_eval = {k: v for r in records if r.get("step") == 0 for k, v in r.items() if k.startswith("eval_")}
    initial_benchmarks = {
        k: v for r in records if r.get("step") == 0 for k, v in r.items() if k.startswith("benchmark/")
    }
    return {
        "train_loss": total / steps if steps else None,
        "initial_eval": initial_eval,
        "initial_benchmarks": initial_benchmarks,
        "rewards": rewards,
    }


def training_summary(trainer, train_loss: float | None, extra: dict | None = None) -> dict:
    """What every run's summary starts with; the time trained is summed over the processes of the run (resumes)."""
    from leap_finetune.recipes.callbacks import CheckpointMarker

    marker = next(c for c in trainer.callback_handler.callbacks if isinstance(c, CheckpointMarker))
    summary = {
        "global_step": trainer.state.global_step,
        "train_loss": train_loss,
        "train_runtime_s": round(marker.trained_seconds(), 3),
        "tokens_seen": trainer.state.num_input_tokens_seen,
        **(extra or {}),
    }
    all_reduce = gradient_all_reduce(trainer)
    if all_reduce:
        summary["gradient_all_reduce"] = all_reduce
    summary.update(gpu_memory_summary())
    return summary


def gpu_memory_summary() -> dict:
    """This process's measured peak GPU memory (torch.cuda.max_memory_allocated, as docs/memory.md predicts it)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {"peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)}


def reward_summary(rewards: list[float]) -> dict:
    """GRPO: the mean reward of the first and the last (up to) 5 logged steps."""
    if not rewards:
        return {}
    window = min(5, len(rewards))
    return {"initial_reward": sum(rewards[:window]) / window, "final_reward": sum(rewards[-window:]) / window}


def evaluation_summary(last: dict, baseline: dict | None) -> dict:
    """The held-out evaluation at the last step, and at step 0 (`baseline`, None when it was not logged)."""
    summary = {
        "eval_loss": float(last["eval_loss"]),
        "initial_eval_loss": baseline.get("eval_loss") if baseline else None,
        "eval_metrics": {k: float(v) for k, v in last.items() if k.startswith("eval_") and is_number(v)},
    }
    if baseline:
        summary["initial_eval_metrics"] = {
            k: float(v) for k, v in baseline.items() if k.startswith("eval_") and is_number(v)
        }
    return summary


def benchmark_summary(final: dict, initial: dict) -> dict:
    return {
        "benchmarks": {k: v for k, v in final.items() if k.endswith(SUMMARY_BENCHMARK_KEYS)},
        "initial_benchmarks": {k: v for k, v in initial.items() if k.endswith(SUMMARY_BENCHMARK_KEYS)},
    }


def stopped_early(run_dir: Path, summary: dict, stop_on_signal, plots) -> dict:
    """A run that stopped before its last step (a signal, a judge that failed): no final evaluation, no model/ (its
    last checkpoint is where it resumes); the plots drawn so far are waited for."""
    summary["stopped_early"] = True
    summary["stopped_by_signal"] = stop_on_signal.received
    plots.wait()
    write_summary(run_dir, summary)
    return summary


def write_summary(run_dir: Path, summary: dict, *, finished: bool = False) -> None:
    if finished:
        summary["finished_at"] = time.time()  # by this process's clock: which run finished last (models.registry)
    write_atomic(RunFolder(run_dir).summary, json.dumps(summary, indent=2))


def is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def gpu_memory_text(summary: dict) -> str:
    """The measured peak of a training process beside the prediction plan made (docs/memory.md)."""
    text = f"{summary['peak_gpu_memory_gib']:.1f} GiB peak per training process"
    if summary.get("predicted_gpu_memory_gib") is not None:
        text += f" (predicted {summary['predicted_gpu_memory_gib']:.1f} GiB)"
    return text
