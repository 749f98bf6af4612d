"""`environment:` checked at validate: GRPO only, the tools loaded and described (the definitions the prompts will
show), what would not do what the user meant refused. The result goes into the resolved config, so the workers and
the data step use the definitions the driver read."""

from __future__ import annotations

from pathlib import Path

from leap_finetune.config.schema import LeapConfigModel
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of

# built-in rewards that read one completion's tool call against a solution: an episode has several turns
SINGLE_TURN_REWARDS = {"tool_call_valid": "tool_success", "tool_call_match": "accuracy (on the final answer)"}


def resolve_environment(model: LeapConfigModel, base: Path, where: str, vision: bool) -> dict | None:
    config = model.environment
    if config is None:
        from leap_finetune.rl.rewards import EPISODE_REWARDS

        for spec in model.rewards.funcs if model.rewards is not None else []:
            name = spec.get("name") if isinstance(spec, dict) else spec
            if name in EPISODE_REWARDS:
                raise LeapError(
                    f"{name} scores a multi-turn episode, and this config has no `environment:`",
                    where=f"{where}: rewards",
                    fix="add environment: {tools: ./tools.py} (docs/agents.md), or remove " + name,
                )
        return None
    benchmarks = model.evals.benchmarks if model.evals is not None else []
    if not method_of(model).rewards and not any(b.metric == "episodes" for b in benchmarks):
        raise LeapError(
            f"'environment:' trains grpo episodes and plays benchmarks with metric episodes; training_type is "
            f"{model.training_type} and no benchmark has metric episodes, so it would do nothing",
            where=where,
            fix="remove environment, set training_type: grpo, or add a benchmark with metric: episodes",
        )
    if config.augment_tools and not method_of(model).rewards:
        raise LeapError(
            "environment.augment_tools disguises the tools of grpo's training episodes; this "
            f"{model.training_type} config plays episodes only in its benchmarks, which always see the real tools",
            where=f"{where}: environment.augment_tools",
            fix="remove it (sft rows: dataset.augment_tools)",
        )
    if vision:
        raise LeapError(
            "environment: multi-turn tool episodes are for text models; this is a vision-language model",
            where=f"{where}: environment",
            fix="remove environment, or train a text model",
        )
    for spec in model.rewards.funcs if model.rewards is not None else []:
        name = spec.get("name") if isinstance(spec, dict) else spec
        if name in SINGLE_TURN_REWARDS:
            raise LeapError(
                f"{name} scores a single turn's tool call; with an environment a completion is a whole "
                "episode (calls, results, final answer)",
                where=f"{where}: rewards",
                fix=f"use {SINGLE_TURN_REWARDS[name]} instead, or a custom reward that reads `episode`",
            )
    source = _source(config, base, f"{where}: environment")
    from leap_finetune.rl.tool_specs import load_toolbox

    key = "environment.handler" if source.kind == "handler" else "environment.tools"
    if source.kind != "http":
        _trial_import(source, config, f"{where}: {key}")
    toolbox = load_toolbox(source, f"{where}: {key}")
    return {
        "source": source.to_json(),
        "schemas": toolbox.schemas,
        "max_turns": config.max_turns,
        "tool_timeout": config.tool_timeout,
        "tool_memory_mb": config.tool_memory_mb,
        "max_result_chars": config.max_result_chars,
        "workers": config.workers,
        "augment_tools": config.augment_tools,
    }


def _source(config, base: Path, where: str):
    from leap_finetune.rl.openenv_http import is_url
    from leap_finetune.rl.tool_specs import ToolSource, schemas_from

    tools = config.tools
    if is_url(tools):
        if config.handler is not None:
            raise LeapError(
                "environment.handler runs JSON-schema tools here; an environment server runs its own",
                where=where,
                fix="remove handler",
            )
        return ToolSource("http", tools.rstrip("/"))
    is_schemas = isinstance(tools, list) or str(tools).endswith(".json")
    if is_schemas:
        if config.handler is None:
            raise LeapError(
                "environment.tools gives JSON tool definitions: they need `handler`, the function that runs a call",
                where=where,
                fix="add handler: ./tools.py::call_tool  (def call_tool(name: str, arguments: dict) -> str), or "
                "give the tools as Python: tools: ./tools.py",
            )
        file, name = _file_and_name(config.handler, base, where, "handler")
        if name is None:
            raise LeapError(
                f"environment.handler is {config.handler!r}: expected ./file.py::function",
                where=where,
                fix="write handler: ./tools.py::call_tool",
            )
        return ToolSource("handler", file, name, tuple(schemas_from(tools, base, where)))
    if config.handler is not None:
        raise LeapError(
            "environment.handler is for JSON-schema tools; these tools are Python, described by their own hints",
            where=where,
            fix="remove handler, or give tools: ./tools.json with it",
        )
    file, name = _file_and_name(tools, base, where, "tools")
    return ToolSource("class" if name else "functions", file, name)


def _file_and_name(value: str, base: Path, where: str, key: str) -> tuple[str, str | None]:
    text = str(value)
    file, _, name = text.partition("::")
    if not file.endswith(".py"):
        raise LeapError(
            f"environment.{key} is {text!r}: expected a Python file (./tools.py, ./env.py::MyEnvironment) or JSON "
            "tool definitions (./tools.json, with handler)",
            where=where,
            fix="name a .py file, relative to the config file's folder",
        )
    path = Path(file).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve()), (name or None)


def _trial_import(source, config, where: str) -> None:
    """The tools imported first in a tool worker, as the run will: a file that ends the process (os._exit, a crash)
    or waits at its top level would otherwise end or hang `validate` itself, without a word."""
    from leap_finetune.rl.tool_workers import ToolWorkers

    try:
        ToolWorkers(
            source, workers=1, timeout=config.tool_timeout, memory_mb=config.tool_memory_mb, max_chars=100
        ).close()
    except LeapError as err:
        raise LeapError(err.message, where=where, fix=err.fix) from None
