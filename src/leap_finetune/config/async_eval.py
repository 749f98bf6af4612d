"""The `async_eval:` block's rules that need the rest of the config (the machine-dependent ones - sbatch
installed, the nodes of the plan, a free port - are in evaluation/async_eval.py's check_async_eval)."""

from __future__ import annotations

from leap_finetune.config.schema import LeapConfigModel
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of


def check_async_eval_config(model: LeapConfigModel, where: str) -> None:
    """What sidecar / reserved evaluation cannot do, said before anything runs (the machine-dependent checks -
    sbatch installed, the nodes of the plan - are in evaluation/async_eval.py's check_async_eval)."""
    mode = model.async_eval.mode if model.async_eval is not None else "sync"
    if mode == "sync":
        return
    at = f"{where}: async_eval.mode"
    if model.evals is None:
        raise LeapError(
            f"async_eval.mode is {mode}, but the config has no benchmarks (no evals: block, or "
            "evals.benchmarks is empty): nothing to evaluate",
            where=at,
            fix="add evals: with benchmarks (docs/evaluation.md), or remove async_eval (for one "
            "run: --set async_eval.mode=sync)",
        )
    if method_of(model).retrieval:
        raise LeapError(
            f"retrieval benchmarks ({model.training_type}) run with the held-out evaluation inside the "
            f"trainer; async_eval.mode {mode} evaluates generation and log-prob benchmarks",
            where=at,
            fix="use mode: sync for an embedding / ColBERT run",
        )
    # (fsdp: benchmarks during training are refused with fsdp in every mode, in validate/training.py check_values)
    if isinstance(model.peft_config, dict) and model.peft_config.get("trainable_token_indices"):
        raise LeapError(
            f"async_eval.mode {mode} evaluates a merged snapshot of the model, and peft_config."
            "trainable_token_indices (trained rows of the embedding) cannot be merged into one yet",
            where=at,
            fix="use mode: sync with trainable_token_indices",
        )
    settings = model.async_eval
    if settings.tensor_parallel_size > max(1, settings.vllm_gpus):
        raise LeapError(
            f"async_eval.tensor_parallel_size is {settings.tensor_parallel_size}, more than the evaluator's "
            f"GPUs (vllm_gpus: {settings.vllm_gpus})",
            where=f"{where}: async_eval.tensor_parallel_size",
            fix="set tensor_parallel_size to vllm_gpus or fewer (1 for a CPU evaluator)",
        )
    if mode == "reserved" and model.slurm is not None and model.slurm.nodes > 1:
        raise LeapError(
            f"async_eval.mode reserved runs the evaluation server on GPUs of one node, and slurm.nodes is "
            f"{model.slurm.nodes}",
            where=at,
            fix="use mode: sidecar for multi-node training (one SLURM job per evaluation)",
        )
