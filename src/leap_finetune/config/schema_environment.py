"""GRPO's `environment:` block: tools the model calls during a rollout, run for real, their results shown to it
(multi-turn episodes, rl/episodes.py; docs/agents.md)."""

from __future__ import annotations

from pydantic import Field

from leap_finetune.config.schema_base import StrictModel


class EnvironmentConfig(StrictModel):
    """Multi-turn GRPO: the model calls tools, sees what they return, answers; the episode is rewarded."""

    tools: str | list[dict] = Field(
        description="Where the tools come from: `./tools.py` (the file's public functions, described by their type "
        "hints and docstrings), `./env.py::ClassName` (a stateful environment: `reset(row)` starts an episode, its "
        "public methods are the tools, one instance per episode), JSON schemas (`./tools.json` or a list here) "
        "with `handler`, or `http://HOST:PORT`: an OpenEnv environment server (its MCP tools, one session per "
        "episode).",
    )
    handler: str | None = Field(
        default=None,
        min_length=1,
        description="With JSON-schema `tools`: `./file.py::function`, called as `function(name, arguments)` for "
        "every call.",
    )
    max_turns: int = Field(
        default=4,
        gt=0,
        le=64,
        description="Assistant turns per episode, the final answer included: an episode that still calls a tool "
        "at its last turn ends there.",
    )
    tool_timeout: float = Field(
        default=10,
        gt=0,
        allow_inf_nan=False,
        description="Seconds a tool call may take; a slower call is stopped and the model sees the timeout as "
        "the tool's result.",
    )
    tool_memory_mb: int = Field(
        default=2048,
        gt=0,
        description="Memory (MiB) the tools may allocate in their worker process beyond what importing them "
        "took; past it a call fails with MemoryError, shown to the model.",
    )
    max_result_chars: int = Field(
        default=4000,
        gt=0,
        description="A tool result longer than this is cut (the model sees where), so one call cannot fill the "
        "completion budget.",
    )
    augment_tools: bool = Field(
        default=False,
        description="Show each training episode the tools under other names, with other argument names, in another "
        "order and reworded (calls are mapped back before they run), so the model learns to read a tool list rather "
        "than memorise one; evaluation episodes see the real tools.",
    )
    workers: int | None = Field(
        default=None,
        gt=0,
        description="Processes that run the tools (each episode stays on one); default: min(8, CPU cores).",
    )
