"""GRPO's blocks: `grpo_rollout:` (the GPUs of the rollout server, the judge and training) and `rewards:` (the
reward functions and the LLM judge)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from leap_finetune.config.numbers import LEAP_VALUE, shown
from leap_finetune.config.schema_base import StrictModel


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
                        "tool_call_match, tool_success, turn_penalty), "
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
        "`pattern`), `length` (with `target_tokens`), `tool_call_valid`, `tool_call_match`; with `environment:` "
        "`tool_success` and `turn_penalty` (with `per_turn`); or "
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
