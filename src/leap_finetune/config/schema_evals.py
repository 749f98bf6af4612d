"""The `evals:` block (benchmarks during training and for `leap-finetune eval`) and `async_eval:` (where they run,
and what a failed evaluation does)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from leap_finetune.config.schema_base import StrictModel

GENERATION_METRICS = (
    "exact_match",
    "short_answer",
    "mcq_gen",
    "bleu",
    "rouge_l",
    "tool_call",
    "grounding_iou",
    "iou@0.5",
)
LOGPROB_METRICS = ("logprob_mcq", "logprob_zero_shot")
EPISODE_METRICS = ("episodes",)


class BenchmarkConfig(StrictModel):
    """One benchmark: rows in the messages schema, scored by one metric."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Used in metric names: benchmark/{name}/score."
    )
    path: str = Field(min_length=1, description="A .jsonl, .json, .parquet or .csv file (or folder) of benchmark rows.")
    metric: str = Field(
        description="Generation: " + ", ".join(GENERATION_METRICS) + ", or ./file.py::function. "
        "Log-prob multiple choice: logprob_mcq (also logprob_zero_shot). Embedding / ColBERT models: retrieval "
        "(path: a folder of corpus.jsonl, queries.jsonl, qrels/test.tsv). Tool episodes in the config's "
        "`environment:`: episodes (GRPO rows: prompt + solution; the score is the share answered right)."
    )
    limit: int | None = Field(default=None, gt=0, description="Use only the first N rows.")
    image_root: str | None = Field(
        default=None,
        min_length=1,
        description="Where the rows' relative image paths start; default: evals.image_root, else the "
        "benchmark file's folder.",
    )
    tool_call_order: Literal["set", "ordered"] | None = Field(
        default=None,
        description="metric: tool_call only: several calls in one turn compared as a set (default: any order) or "
        "in the order of the reference.",
    )

    @model_validator(mode="after")
    def _order_with_tool_call(self):
        if self.tool_call_order is not None and self.metric != "tool_call":
            raise ValueError(f"tool_call_order goes with metric: tool_call (this benchmark's metric is {self.metric})")
        return self


class EvalsConfig(StrictModel):
    """Benchmarks run before the first step, every `eval_steps`, and after the last step."""

    benchmarks: list[BenchmarkConfig] = Field(
        description="The benchmarks to run; `[]` runs none (as without "
        "`evals:`), e.g. `--set 'evals.benchmarks=[]'` for one run."
    )
    image_root: str | None = Field(
        default=None,
        min_length=1,
        description="Where every benchmark's relative image paths start (a benchmark's own image_root wins); "
        "default: each benchmark file's folder.",
    )
    max_new_tokens: int = Field(default=128, gt=0, description="Generation length limit for generation benchmarks.")
    batch_size: int = Field(default=8, gt=0, description="Rows per generation batch / options per scoring batch.")
    do_sample: bool = Field(default=False, description="Sample instead of greedy decoding.")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature (with do_sample).")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling (with do_sample).")
    eval_steps: int | None = Field(
        default=None, gt=0, description="Run benchmarks every N steps; default: training_config.eval_steps."
    )


class SbatchConfig(StrictModel):
    time: str = Field(
        default="00:30:00",
        description="Wall-clock limit of each sidecar evaluation job (SLURM's format: MM, HH:MM:SS, "
        "D-HH:MM:SS); a job that runs past it counts as a failed evaluation.",
    )
    partition: str | None = Field(
        default=None,
        min_length=1,
        description="SLURM partition of the evaluation jobs (default: the cluster's default partition).",
    )
    account: str | None = Field(default=None, min_length=1, description="SLURM account charged for the jobs.")
    extra_args: list[str] = Field(
        default_factory=list, description='More sbatch options, each one string, e.g. ["--qos=eval", "--mem=32G"].'
    )

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str) -> str:
        if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", value):
            raise ValueError(f"'{value}' is not a SLURM time limit; expected e.g. 00:30:00, 90 (minutes) or 1-00:00:00")
        return value


class ReservedEvalConfig(StrictModel):
    weight_reload: Literal["respawn", "in_place"] = Field(
        default="respawn",
        description="How the eval server picks up new weights: `respawn` restarts it on each new snapshot; "
        "`in_place` starts the evaluation server once (vLLM where installed and vllm_gpus > 0, else leap-finetune's) "
        "and loads each snapshot's weights into it.",
    )
    server_port: int = Field(default=8100, gt=0, lt=65536, description="Port of the evaluation server (127.0.0.1).")
    start_timeout_s: float = Field(
        default=600,
        gt=0,
        description="An evaluation server that does not answer its "
        "health check within this time counts as a failed evaluation.",
    )


class EvalFailureConfig(StrictModel):
    max_consecutive: int = Field(
        default=3,
        gt=0,
        description="After this many failed evaluations in a row, evaluation "
        "is switched off for the rest of the run; training goes on.",
    )
    max_submit_attempts: int = Field(
        default=3,
        gt=0,
        description="sidecar: sbatch tries per evaluation job; a refused submission (a busy controller) is tried "
        "again after submit_retry_backoff seconds, doubled each time.",
    )
    submit_retry_backoff: float = Field(
        default=2.0,
        ge=0,
        allow_inf_nan=False,
        description="sidecar: seconds before the second sbatch try (then 2x, 4x ...).",
    )


class AsyncEvalConfig(StrictModel):
    """Where benchmarks run. `sync` (default): training pauses while they run. `sidecar`: one SLURM job per
    evaluation on a snapshot of the model. `reserved`: an evaluation server on GPUs kept out of training."""

    mode: Literal["sync", "sidecar", "reserved"] = Field(
        default="sync",
        description="sync (training pauses), sidecar (an sbatch job per evaluation) or reserved "
        "(an evaluation server on GPUs taken out of training; one node only).",
    )
    vllm_gpus: int = Field(
        default=1,
        ge=0,
        description="GPUs of the evaluator (sidecar: per job; reserved: taken out "
        "of training). 0: the evaluator runs on CPU.",
    )
    tensor_parallel_size: int = Field(default=1, gt=0, description="Tensor parallelism of a vLLM evaluation server.")
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1, description="vLLM memory fraction.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto",
        description="The vLLM evaluation server's weights and activations (`--dtype`); `auto`: the saved "
        "snapshot's dtype (the training dtype).",
    )
    max_model_len: int | None = Field(
        default=None,
        gt=0,
        description="The vLLM evaluation server's context (`--max-model-len`): less KV-cache memory; default: "
        "the model's own.",
    )
    on_overlap: Literal["queue", "skip"] = Field(
        default="queue",
        description="An evaluation due while the previous one still runs: `queue` (its snapshot "
        "waits its turn; at most 3 wait) or `skip` (not taken, with a line). The final evaluation always queues.",
    )
    wait_at_end_s: float = Field(
        default=3600,
        gt=0,
        description="At the end of training, how long to wait for "
        "evaluations still running (their results are logged); then they are stopped.",
    )
    sbatch: SbatchConfig = Field(default_factory=SbatchConfig, description="sidecar: the sbatch job's settings.")
    reserved: ReservedEvalConfig = Field(default_factory=ReservedEvalConfig, description="reserved: server settings.")
    failure: EvalFailureConfig = Field(default_factory=EvalFailureConfig, description="Failure isolation (every mode).")
