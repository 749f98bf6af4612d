"""The YAML contract: one pydantic model per block.

`training_config` and `peft_config` are open-ended on purpose (any TRL / transformers training
argument and any peft LoRA option can be set), so they are checked against the fields of the
underlying library classes in `loader.py` rather than copied here.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from leap_finetune.config.numbers import LEAP_VALUE, check_field, shown
from leap_finetune.methods import training_types


def __getattr__(name: str):
    # TRAINING_TYPES, SUPPORTED_TRAINING_TYPES: the registry's names when asked (a type registered later is in them;
    # every type in methods/ is supported in this version)
    if name in ("TRAINING_TYPES", "SUPPORTED_TRAINING_TYPES"):
        return training_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def check_numbers(cls, value, info):
        """`true` or `.nan` where a number is expected is refused (pydantic would read `true` as 1)."""
        return check_field(value, cls.model_fields[info.field_name])


class DatasetConfig(StrictModel):
    """Where the training rows come from and how they are split."""

    path: str = Field(
        min_length=1,
        description="A local file (.jsonl, .json, .parquet, .csv), a folder of such files, or a Hub dataset id.",
    )
    type: str | None = Field(
        default=None,
        description="Row format; defaults to the training type (`sft`: rows with a `messages` list).",
    )
    limit: int | None = Field(
        default=None,
        gt=0,
        description="Use only the first N rows of `path` (those rows are the dataset: each is validated).",
    )
    test_size: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Hold out this fraction (0-1) or this many rows (>= 1) for evaluation. Ignored when `val_path` is set.",
    )
    split: str = Field(default="train", description="Split to read from a Hub dataset.")
    subset: str | None = Field(default=None, description="Configuration (subset) of a Hub dataset.")
    val_path: str | None = Field(
        default=None, min_length=1, description="A separate evaluation dataset (same formats as `path`)."
    )
    on_invalid: Literal["error", "skip"] = Field(
        default="error",
        description="`error`: stop and list invalid rows. `skip`: drop them, print why, and save them to dropped_rows.jsonl.",
    )
    weight: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="With several sources (`dataset:` as a list): this source's share of the training rows, relative "
        "to the other sources' weights (sampled with `seed`; a share above its rows repeats rows). Give every source a "
        "weight (a finite number > 0), or none.",
    )
    epochs: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="This source's rows per training epoch, as a multiple of its rows: 2 repeats each row twice, 0.5 "
        "takes half of them (sampled with `seed`). Not with `weight`.",
    )
    num_proc: int | None = Field(
        default=None,
        ge=1,
        description="Processes that check and tokenize the rows (at most the machine's cores); default: one per "
        "~2,000 rows, up to every core (Linux; one elsewhere).",
    )
    image_root: str | None = Field(
        default=None,
        min_length=1,
        description="Vision-language models: the folder relative image paths in the rows start from (default: the "
        "folder of the data file that names them).",
    )
    hold_out_tools: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Tool-calling data (sft, grpo): every row that names one of these tools (calls it, or lists it "
        "among its tool definitions) is left out of training and evaluation rows, and becomes the `unseen_tools` "
        "benchmark (metric tool_call): how well the model calls tools it never saw. A tool named in any source is "
        "held out of every source. See docs/tool-calling.md.",
    )
    cache: bool = Field(
        default=True,
        description="Keep the prepared rows on disk ($LEAP_FINETUNE_CACHE, default ~/.cache/leap-finetune/prepared), "
        "keyed by everything they depend on: `run` after `validate` reads them instead of preparing again.",
    )

    @model_validator(mode="after")
    def check_mixing(self) -> DatasetConfig:
        if self.weight is not None and self.epochs is not None:
            raise ValueError(
                "give a source either weight (its share of the mix) or epochs (a multiple of its rows), not both"
            )
        return self

    @field_validator("hold_out_tools")
    @classmethod
    def check_hold_out_tools(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        for name in value:
            if not name.strip():
                raise ValueError("a tool name is empty: give the function names of the tools to hold out")
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"a tool is named twice: {', '.join(repeated)}")
        return value

    @field_validator("test_size")
    @classmethod
    def check_test_size(cls, value: float | None) -> float | None:
        if value is not None and value >= 1 and value != int(value):
            raise ValueError("a test_size >= 1 is a row count and must be a whole number (or use a fraction below 1)")
        return value


class ImageProcessorConfig(StrictModel):
    """Vision-language models: how images become tokens (LFM2-VL's image processor settings; unset keys keep the
    model's own). Used to count each row's image tokens while the rows are checked, to build the batches, and
    saved with the trained model so that inference sees images the same way."""

    min_image_tokens: int | None = Field(
        default=None, ge=1, description="Tokens of the smallest image (small images are scaled up to it)."
    )
    max_image_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Tokens of one tile or of an image that is not split (256 for LFM2-VL: a 512x512 tile). "
        "Lower it to make rows with images shorter.",
    )
    do_image_splitting: bool | None = Field(
        default=None, description="Split large images into tiles (plus a thumbnail); false: one resized image each."
    )
    min_tiles: int | None = Field(default=None, ge=1, description="Fewest tiles of a split image.")
    max_tiles: int | None = Field(
        default=None, ge=1, description="Most tiles of a split image (each up to max_image_tokens tokens)."
    )
    use_thumbnail: bool | None = Field(default=None, description="Add a thumbnail of the whole image to its tiles.")

    @model_validator(mode="after")
    def check_ranges(self) -> ImageProcessorConfig:
        for low, high in (("min_image_tokens", "max_image_tokens"), ("min_tiles", "max_tiles")):
            a, b = getattr(self, low), getattr(self, high)
            if a is not None and b is not None and a > b:
                raise ValueError(f"{low} ({a}) is larger than {high} ({b})")
        return self

    def settings(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}


GENERATION_METRICS = ("exact_match", "short_answer", "mcq_gen", "bleu", "rouge_l", "tool_call")
LOGPROB_METRICS = ("logprob_mcq", "logprob_zero_shot")


class BenchmarkConfig(StrictModel):
    """One benchmark: rows in the messages schema, scored by one metric."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Used in metric names: benchmark/{name}/score."
    )
    path: str = Field(min_length=1, description="A .jsonl, .json, .parquet or .csv file (or folder) of benchmark rows.")
    metric: str = Field(
        description="Generation: " + ", ".join(GENERATION_METRICS) + ", or ./file.py::function. "
        "Log-prob multiple choice: logprob_mcq (also logprob_zero_shot). Embedding / ColBERT models: retrieval "
        "(path: a folder of corpus.jsonl, queries.jsonl, qrels/test.tsv)."
    )
    limit: int | None = Field(default=None, gt=0, description="Use only the first N rows.")
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


class RayConfig(StrictModel):
    """Training on several devices with Ray Train: one worker process per training GPU (or `num_workers`
    CPU workers), data-parallel (DDP; FSDP with `training_config.fsdp`)."""

    address: str | None = Field(
        default=None,
        min_length=1,
        description="An existing Ray cluster (`host:port`, or `auto`) for multi-node runs; default: the RAY_ADDRESS "
        "environment variable, else a local Ray instance when more than one worker is planned.",
    )
    num_workers: int | None = Field(
        default=None,
        gt=0,
        description="Training processes. Default: one per training GPU of the plan (all visible GPUs not reserved "
        "for servers); without GPUs, 1 (in-process). N CPU workers (gloo) run the distributed path on a laptop.",
    )
    resources_per_worker: dict[str, float] | None = Field(
        default=None,
        description="Ray resources per worker, e.g. {CPU: 8, GPU: 1} (default: 1 GPU on GPUs, 1 CPU "
        "otherwise): CPU, GPU, memory (bytes) or a custom resource of the cluster, finite amounts >= 0; the workers "
        "must fit on the cluster, checked before any starts.",
    )
    connect_timeout_s: float = Field(default=30, gt=0, description="How long to wait for `address` to answer.")


class SlurmConfig(StrictModel):
    """`leap-finetune slurm`: an sbatch script that brings up a Ray cluster over the allocation and runs the
    job on it. `--nodes` / `--gpus-per-node` on the command line override `nodes` / `gpus_per_node`."""

    partition: str | None = Field(default=None, min_length=1, description="#SBATCH --partition.")
    account: str | None = Field(default=None, min_length=1, description="#SBATCH --account.")
    time: str = Field(default="04:00:00", min_length=1, description="#SBATCH --time: the job's wall-clock limit.")
    nodes: int = Field(default=1, gt=0, description="#SBATCH --nodes.")
    gpus_per_node: int = Field(default=0, ge=0, description="#SBATCH --gpus-per-node (0: a CPU job).")
    cpus_per_task: int | None = Field(
        default=None,
        gt=0,
        description="#SBATCH --cpus-per-task (one task per node runs Ray there); default: the partition's default.",
    )
    mem: str | None = Field(default=None, min_length=1, description="#SBATCH --mem, e.g. 200G.")
    job_name: str | None = Field(default=None, min_length=1, description="#SBATCH --job-name; default: project_name.")
    extra_sbatch: list[str] = Field(
        default_factory=list,
        description='More #SBATCH options, e.g. ["--qos=high"], '
        "one line each, as sbatch reads them (a value with spaces or `#` in double quotes: "
        '--comment="run #2").',
    )
    setup: list[str] = Field(
        default_factory=list,
        description='Shell lines run first on the head node, e.g. ["module load cuda", "source ~/venv/bin/activate"].',
    )
    ray_start_timeout_s: int = Field(default=600, gt=0, description="How long to wait for every node's GPUs to join.")
    stop_before_time_limit_s: int = Field(
        default=300,
        ge=0,
        le=65535,
        description="#SBATCH --signal=B:TERM@N: this many seconds "
        "before the time limit the run is asked to save a checkpoint and stop (SLURM "
        "sends it up to 60 s early); 0: no warning, the limit's own SIGTERM leaves "
        "the cluster's KillWait to save one.",
    )

    @model_validator(mode="after")
    def _stop_within_the_limit(self) -> SlurmConfig:
        limit = slurm_seconds(self.time)
        if limit is not None and self.stop_before_time_limit_s and self.stop_before_time_limit_s >= limit:
            raise ValueError(
                f"stop_before_time_limit_s ({self.stop_before_time_limit_s} s) is not shorter than the "
                f"job's time limit ({self.time} = {limit} s): the run would be asked to stop as it "
                "starts; give fewer seconds (or 0) or a longer time"
            )
        return self


def slurm_seconds(value: str) -> int | None:
    """A SLURM time limit in seconds (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None when it is not one."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value.strip())
    if not match:
        return None
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # HH:MM:SS
        return a * 3600 + b * 60 + c
    return a * 60 + (b or 0)  # MM[:SS]


class GrpoRolloutConfig(StrictModel):
    """GRPO: where rollouts and the judge run, by GPU counts. Local servers are started by the driver before
    any training worker, on the first GPUs of the node: [server][judge][training]."""

    server_gpus: int = Field(
        default=0,
        ge=0,
        description="GPUs for the local vLLM rollout server "
        "(`training_config.vllm_mode: server` without `vllm_server_base_url`).",
    )
    judge_gpus: int = Field(
        default=0,
        ge=0,
        description="GPUs for the local judge server (`rewards.judge` without "
        "`base_url`): `vllm serve` where vLLM is installed, else `transformers serve`; 0 runs it on "
        "CPU (`transformers serve`, for tiny judges and tests).",
    )
    judge_port: int = Field(default=8001, gt=0, lt=65536, description="The local judge server's port.")
    training_gpus: int | None = Field(default=None, gt=0, description="GPUs for training; default: the rest.")
    tensor_parallel_size: int = Field(default=1, gt=0, description="Tensor parallelism of the local vLLM servers.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="bfloat16", description="Weights' dtype in the local vLLM servers."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1, description="vLLM's GPU memory fraction in the local servers."
    )
    max_model_len: int | None = Field(
        default=None, gt=0, description="vLLM's context length in the local servers; default: the model's."
    )
    server_start_timeout_s: float = Field(
        default=600, gt=0, description="How long the driver waits for a local server to answer its health check."
    )


class RetrievalPrompts(StrictModel):
    query: str | None = Field(default=None, description='Text put before every query, e.g. "query: ".')
    document: str | None = Field(
        default=None, description='Text put before every document (positive and negatives), e.g. "document: ".'
    )


class RetrievalConfig(StrictModel):
    """embedding / colbert: the loss, prompts, lengths and (for a backbone that is not yet an embedding
    model) the pooling. Built on sentence-transformers."""

    loss: Literal["mnrl", "cached_mnrl"] = Field(
        default="mnrl",
        description="`mnrl`: in-batch negatives (multiple negatives ranking; ColBERT: its "
        "contrastive MaxSim loss); `cached_mnrl`: the same with GradCache, for large batches in little memory.",
    )
    mini_batch_size: int = Field(default=32, gt=0, description="`cached_mnrl`: rows encoded at once.")
    prompts: RetrievalPrompts = Field(default_factory=RetrievalPrompts, description="Query and document prompts.")
    query_max_length: int | None = Field(
        default=None,
        gt=0,
        description="Tokens kept of a query, prompt included "
        "(default: the model's maximum); longer queries are cut and counted.",
    )
    document_max_length: int | None = Field(
        default=None,
        gt=0,
        description="Tokens kept of a document, prompt "
        "included (default: the model's maximum); longer ones are cut and counted.",
    )
    pooling: Literal["auto", "mean", "lasttoken", "cls"] = Field(
        default="auto",
        description="embedding, for a model without a sentence-transformers config: `auto` is "
        "last-token pooling for a causal LM (LFM2), mean pooling for an encoder.",
    )


DEFAULT_JUDGE_PROMPT = (
    "You are grading an answer.\n\nQuestion:\n{prompt}\n\nReference answer:\n{solution}\n\n"
    'Answer to grade:\n{completion}\n\nReply with a JSON object {{"score": S}}, S an integer from {min_score} '
    "(wrong) to {max_score} (fully correct and complete)."
)


class JudgeConfig(StrictModel):
    """An LLM judge over the OpenAI-compatible chat-completions API (vLLM, transformers serve, llama.cpp's
    server, a hosted API)."""

    model: str = Field(min_length=1, description="The model the judge requests name (and a local judge serves).")
    base_url: str | None = Field(
        default=None,
        min_length=1,
        description="An external server, e.g. "
        "http://judge:8000/v1; without it the driver starts a local judge on "
        "`grpo_rollout.judge_gpus`.",
    )
    prompt_template: str = Field(
        default=DEFAULT_JUDGE_PROMPT,
        min_length=1,
        description="The judge's prompt: `{prompt}`, `{completion}`, `{solution}`, "
        "`{min_score}`, `{max_score}` are filled in (write `{{`/`}}` for braces).",
    )
    min_score: float = Field(
        default=0, allow_inf_nan=False, description="The lowest score the judge gives (normalised to 0)."
    )
    max_score: float = Field(
        default=10, allow_inf_nan=False, description="The highest score the judge gives (normalised to 1)."
    )
    weight: float = Field(
        default=1.0,
        allow_inf_nan=False,
        description="The judge's weight among the rewards (unless `rewards.weights` lists it).",
    )
    failure_score: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="The normalised reward of a completion the "
        "judge could not score (timeout, error, no number in its answer); such failures "
        "are counted (`judge/failures` in the metrics, the progress line, the run report).",
    )
    timeout_s: float = Field(
        default=30,
        gt=0,
        allow_inf_nan=False,
        description="Per request attempt (a judge that does not answer costs "
        "a step at most timeout_s x (retries + 1): when the first requests of a step all fail, "
        "its other completions are not sent).",
    )
    max_concurrency: int = Field(default=8, gt=0, description="Requests in flight at once.")
    retries: int = Field(
        default=1,
        ge=0,
        description="Retries after a connection error, a timeout or a 5xx answer, with exponential backoff.",
    )
    max_failed_steps: int = Field(
        default=3,
        ge=0,
        description="Steps in a row in which every judge request fails "
        "before the run saves a checkpoint and stops with an error naming the judge's last "
        "failure; 0: never stop (failures still show on the progress line and in the report).",
    )
    check_at_validate: bool = Field(
        default=True,
        description="`validate` and `run` ask `base_url` for its models (GET "
        "/models) and check that `model` is served.",
    )
    api_key_env: str | None = Field(
        default=None,
        min_length=1,
        description="The environment variable that holds "
        "the API key (the key itself never goes in the config or the logs).",
    )
    temperature: float = Field(default=0.0, ge=0, allow_inf_nan=False, description="The judge's sampling temperature.")
    max_tokens: int = Field(default=64, gt=0, description="The judge's answer length limit.")


def reward_list(value):
    """`funcs` as a list: one name alone is a list of one; an entry that is neither a name nor a mapping is refused
    here, with its index (pydantic would list the union's members)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        for index, entry in enumerate(value):
            if not isinstance(entry, (str, dict)):
                raise PydanticCustomError(
                    LEAP_VALUE,
                    "{shown} is not a reward",
                    {
                        "shown": shown(entry),
                        "index": index,
                        "expected": "a reward's name: a built-in (accuracy, format, length, tool_call_valid, "
                        "tool_call_match), "
                        "./file.py::function, or a mapping {name: ..., its options}",
                        "fix": "write e.g. rewards: [accuracy] or rewards: [./my_rewards.py::my_reward]",
                    },
                )
    return value


class RewardsConfig(StrictModel):
    """GRPO's rewards: built-in or custom functions, and an optional LLM judge."""

    funcs: list[str | dict] = Field(
        default_factory=list,
        description="Built-ins: `accuracy`, `format` (with "
        "`pattern`), `length` (with `target_tokens`), `tool_call_valid`, `tool_call_match`; or "
        "`path/to/file.py::function`. A mapping gives options: `{name: format, pattern: "
        "'^Answer:'}`. One name alone is a list of one.",
    )
    weights: list[float] | None = Field(
        default=None,
        description="One weight per function, then the judge's; "
        "default: 1 each (the judge: `judge.weight`). Finite; 0 leaves a reward out of "
        "training (it is still computed and logged), so at least one must not be 0.",
    )
    judge: JudgeConfig | None = Field(default=None, description="An LLM judge (keys below).")
    check_at_validate: bool = Field(
        default=True,
        description="`validate` and `run` (before the model loads) call "
        "each custom function once on the first 2 training rows, with the row's solution "
        "and an empty text as completions, and check what it returns; false skips the "
        "call (your code is run). The judge has its own `judge.check_at_validate`.",
    )

    @field_validator("funcs", mode="before")
    @classmethod
    def check_funcs(cls, value):
        return reward_list(value)


def dataset_shorthand(value):
    """`dataset: PATH` (or a list with PATH items) as the mappings it stands for: `{path: PATH}`."""
    if isinstance(value, str):
        return {"path": value}
    if isinstance(value, list):
        return [{"path": item} if isinstance(item, str) else item for item in value]
    return value


class LeapConfigModel(StrictModel):
    """The top level of a leap-finetune YAML file."""

    project_name: str = Field(
        default="leap-finetune",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Groups runs under outputs/{project_name}/.",
    )
    model_name: str = Field(
        min_length=1,
        description="A Hub id, an LFM short name (LFM2-1.2B), a local folder (a model folder; a run folder: its model/; a project folder ./outputs/PROJECT: the model/ of its newest finished run), or a built-in tiny model (tiny-lfm2, tiny-lfm2.5, tiny-lfm2.5-vl).",
    )
    training_type: str = Field(default="sft", description="One of: " + ", ".join(training_types()) + ".")
    chat_template: str | None = Field(
        default=None,
        description="`lfm2`, `lfm2.5`, `lfm2-v1`, `model` (the tokenizer's own) or a .jinja file; default: chosen from the model family.",
    )
    dataset: DatasetConfig | list[DatasetConfig] | None = Field(
        default=None,
        description="Where the training rows come from (keys below); required to train. A list of such "
        "mappings mixes several sources (each with its own keys, `weight` or `epochs`). A path alone is shorthand "
        "for `{path: ...}`.",
    )
    training_config: dict = Field(
        default_factory=dict,
        description="Any TRL / sentence-transformers training argument, plus leap-finetune's own keys: `extends`, `loss_on`, `compile_layers`, `padding_free`, `optimizer_precision`, `batch_tokens`, `gradient_communication`, `resume_allow_changes` and the vision keys (docs/config.md).",
    )
    peft_config: dict | None = Field(
        default=None, description="LoRA options (any peft LoraConfig field), plus `extends` and `use_peft`."
    )
    output_dir: str | None = Field(
        default=None, min_length=1, description="Run folder; default outputs/{project_name}/{run_name}."
    )
    evals: EvalsConfig | None = Field(
        default=None, description="Benchmarks during training and for `leap-finetune eval`."
    )
    async_eval: AsyncEvalConfig | None = Field(
        default=None,
        description="Where benchmarks run: sync (training pauses; the default), sidecar (SLURM jobs) "
        "or reserved (an evaluation server on GPUs of its own), and the failure policy (keys below).",
    )
    slurm: SlurmConfig | None = Field(
        default=None, description="`leap-finetune slurm`: the sbatch job that runs this config (keys below)."
    )
    ray: RayConfig | None = Field(
        default=None,
        description="Several devices or nodes through Ray Train (keys below); default: decided from the visible GPUs.",
    )
    grpo_rollout: GrpoRolloutConfig | None = Field(
        default=None, description="GRPO: GPUs for the rollout server, the judge and training (keys below)."
    )
    rewards: RewardsConfig | None = Field(
        default=None, description="GRPO's rewards (keys below); a list (or one name) is shorthand for `funcs`."
    )
    retrieval: RetrievalConfig | None = Field(
        default=None, description="embedding / colbert: loss, prompts, lengths, pooling (keys below)."
    )
    checkpoint: str | None = Field(
        default=None,
        min_length=1,
        description="`leap-finetune eval` only: a run folder, checkpoint folder or GGUF file (`export --gguf`) to "
        "evaluate instead of model_name.",
    )
    image_processor: ImageProcessorConfig | None = Field(
        default=None,
        description="Vision-language models: how images become tokens (keys below; default: the model's own).",
    )
    samples: int = Field(
        default=0,
        ge=0,
        description="Print the model's answers to this many held-out prompts before and after training.",
    )

    @field_validator(
        "dataset", mode="before", json_schema_input_type=DatasetConfig | list[DatasetConfig | str] | str | None
    )
    @classmethod
    def check_dataset(cls, value):
        """`dataset: data/train.jsonl` is shorthand for `dataset: {path: data/train.jsonl}` (in a list too)."""
        return dataset_shorthand(value)

    @field_validator("rewards", mode="before", json_schema_input_type=RewardsConfig | list[str | dict] | str | None)
    @classmethod
    def check_rewards(cls, value):
        """`rewards: [accuracy]` and `rewards: accuracy` are shorthand for `rewards: {funcs: [accuracy]}`."""
        if isinstance(value, (list, str)):
            return {"funcs": reward_list(value)}
        return value
