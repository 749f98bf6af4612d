"""The `evals:` block resolved: benchmark names unique, paths against the config's folder, metrics known (or a
custom ./file.py::function), and retrieval benchmarks only for the types that train retrieval models."""

from __future__ import annotations

from pathlib import Path

from leap_finetune.config.paths import local_path
from leap_finetune.config.schema import LeapConfigModel
from leap_finetune.config.schema_evals import EPISODE_METRICS, GENERATION_METRICS, LOGPROB_METRICS, EvalsConfig
from leap_finetune.config.suggest import did_you_mean
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of
from leap_finetune.validate.datasets import resolve_data_path


def resolve_evals(evals: EvalsConfig | None, base: Path, where: str) -> EvalsConfig | None:
    if evals is None:
        return None
    evals = evals.model_copy(deep=True)
    names = set()
    for index, bench in enumerate(evals.benchmarks):
        here = f"{where}: evals.benchmarks[{index}]"
        if bench.name in names:
            raise LeapError(
                f"two benchmarks are named '{bench.name}'", where=here, fix="give each benchmark its own name"
            )
        names.add(bench.name)
        bench.path = resolve_data_path(bench.path, base)
        bench.image_root = _image_root(bench.image_root or evals.image_root, base, f"{here}.image_root")
        if "::" in bench.metric:
            file, _, function = bench.metric.partition("::")
            path = local_path(file, base)
            if not path.is_file() or not function.isidentifier():
                raise LeapError(
                    f"custom metric '{bench.metric}': "
                    + ("file not found" if not path.is_file() else "bad function name"),
                    where=f"{here}.metric",
                    fix="write it as ./my_metrics.py::function_name (the path relative to the config file)",
                )
            bench.metric = f"{path}::{function}"
        elif bench.metric == "retrieval":
            bench.path = str(local_path(bench.path, base))  # a folder (BEIR layout), never a Hub id
        elif bench.metric not in GENERATION_METRICS + LOGPROB_METRICS + EPISODE_METRICS:
            hint = did_you_mean(bench.metric, GENERATION_METRICS + LOGPROB_METRICS + EPISODE_METRICS + ("retrieval",))
            raise LeapError(
                f"unknown metric '{bench.metric}'",
                where=f"{here}.metric",
                fix=(hint + " " if hint else "")
                + "generation metrics: "
                + ", ".join(GENERATION_METRICS)
                + "; log-prob multiple choice: logprob_mcq; tool episodes in the config's environment: episodes; or "
                "./file.py::function; for embedding/colbert models: retrieval",
            )
    return evals


def _image_root(root: str | None, base: Path, where: str) -> str | None:
    """A benchmark's image folder, from the config's folder; one that is not a folder is said here."""
    if root is None:
        return None
    folder = local_path(root, base)
    if not folder.is_dir():
        raise LeapError(
            f"image_root is not a folder: {folder}",
            where=where,
            fix="give the folder the rows' relative image paths start from (or remove image_root: the benchmark "
            "file's folder)",
        )
    return str(folder)


def check_retrieval_metrics(model: LeapConfigModel, evals: EvalsConfig | None, where: str) -> None:
    """metric: retrieval scores embedding and ColBERT models: refused for a type that trains none."""
    if method_of(model).retrieval:
        return
    for index, bench in enumerate(evals.benchmarks if evals is not None else []):
        if bench.metric == "retrieval":
            raise LeapError(
                f"benchmark '{bench.name}' has metric retrieval, which scores embedding and ColBERT "
                f"models, and training_type is {model.training_type}",
                where=f"{where}: evals.benchmarks[{index}].metric",
                fix="use a generation or log-prob metric (docs/evaluation.md), or training_type: embedding / colbert",
            )


def check_episode_benchmarks(model: LeapConfigModel, evals: EvalsConfig | None, where: str) -> None:
    """metric: episodes plays its rows in the config's `environment:`, in the process that holds the model."""
    for index, bench in enumerate(evals.benchmarks if evals is not None else []):
        if bench.metric != "episodes":
            continue
        here = f"{where}: evals.benchmarks[{index}].metric"
        if model.environment is None:
            raise LeapError(
                f"benchmark '{bench.name}' (metric episodes) plays its rows as tool episodes in the config's "
                "environment, and this config has no `environment:`",
                where=here,
                fix="add environment: {tools: ./tools.py} (docs/agents.md): on sft it serves the benchmark only",
            )
        mode = model.async_eval.mode if model.async_eval is not None else "sync"
        if mode != "sync":
            raise LeapError(
                f"benchmark '{bench.name}' (metric episodes) runs its tools beside the model in the training "
                f"process; async_eval mode {mode} evaluates on a server that answers one turn at a time",
                where=here,
                fix="use async_eval.mode: sync for this config, or score the episodes after training with "
                "leap-finetune eval CONFIG --set checkpoint=RUN",
            )


def check_best_benchmark(model, training: dict, evals: EvalsConfig | None, where: str) -> None:
    """metric_for_best_model on a benchmark's score: the benchmarks must score a step while its checkpoint can be
    kept - in the training process (sync) and at steps where a checkpoint is saved."""
    from leap_finetune.config.rules import benchmark_every, best_benchmark

    name = best_benchmark(training)
    if name is None or evals is None:
        return
    here = f"{where}: training_config.metric_for_best_model"
    if model.async_eval is not None and model.async_eval.mode != "sync":
        raise LeapError(
            f"metric_for_best_model is benchmark '{name}', but async_eval.mode is {model.async_eval.mode}: its "
            "scores arrive after the checkpoint of their step may be gone",
            where=here,
            fix="use async_eval.mode: sync for the best checkpoint by a benchmark, or metric_for_best_model: eval_loss",
        )
    if model.ray is not None and (model.ray.num_workers or 1) > 1:
        raise LeapError(
            f"metric_for_best_model is benchmark '{name}', and the run has {model.ray.num_workers} workers: the "
            "benchmarks run on rank 0 only, and the best checkpoint must be chosen on every rank alike",
            where=here,
            fix="train on one worker for the best checkpoint by a benchmark, or use metric_for_best_model: eval_loss",
        )
    every = benchmark_every(evals, training)
    strategy, save_steps = training.get("save_strategy", "steps"), training.get("save_steps", 500)
    if strategy != "steps" or not isinstance(save_steps, int) or save_steps < 1 or every % save_steps:
        raise LeapError(
            f"metric_for_best_model is benchmark '{name}', scored every {every} steps, but checkpoints are saved "
            + ("never" if strategy == "no" else f"with save_strategy {strategy}, save_steps {save_steps}")
            + ": the best step's checkpoint would not exist",
            where=here,
            fix=f"set save_strategy: steps and save_steps to {every} (or a divisor of it), or evals.eval_steps to a "
            "multiple of save_steps",
        )
