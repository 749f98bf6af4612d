"""The keys of a config file: unknown ones (with where they belong, when they are another block's), and
pydantic's verdicts said in our words - shared by the loader and the dataset block."""

from __future__ import annotations

import dataclasses

from pydantic import ValidationError

from leap_finetune.config.cluster_values import check_eval_sbatch_values, check_ray_values, check_slurm_values
from leap_finetune.config.schema import LeapConfigModel, RetrievalConfig, RetrievalPrompts
from leap_finetune.config.schema_cluster import RayConfig, SlurmConfig
from leap_finetune.config.schema_dataset import ImageProcessorConfig
from leap_finetune.config.schema_environment import EnvironmentConfig
from leap_finetune.config.schema_evals import (
    AsyncEvalConfig,
    BenchmarkConfig,
    EvalFailureConfig,
    EvalsConfig,
    ReservedEvalConfig,
    SbatchConfig,
)
from leap_finetune.config.schema_grpo import GrpoRolloutConfig, JudgeConfig, RewardsConfig
from leap_finetune.config.suggest import unknown_key_fix
from leap_finetune.errors import LeapError
from leap_finetune.methods import METHODS

# LoRA options written at the top level (they belong under peft_config)
LORA_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "use_peft", "modules_to_save", "bias")


def check_top_level_keys(raw: dict, where: str) -> None:
    """Unknown top-level keys; a training argument or a LoRA option written there is told where it belongs."""
    for key in raw:
        if key in LeapConfigModel.model_fields:
            continue
        kind = raw.get("training_type") if raw.get("training_type") in METHODS else "sft"
        value = raw[key]
        if key in LORA_KEYS:
            raise LeapError(
                f"'{key}' is a LoRA option, not a top-level key",
                where=f"{where}: {key}",
                fix=f"move it under peft_config:  peft_config: {{{key}: {value!r}}}",
            )
        if key in METHODS[kind].own_keys or (not key.startswith("_") and key in trainer_arg_fields(kind)):
            raise LeapError(
                f"'{key}' is a training argument, not a top-level key",
                where=f"{where}: {key}",
                fix=f"move it under training_config:  training_config: {{{key}: {value!r}}}",
            )
        check_keys({key: value}, LeapConfigModel.model_fields, where, "the top level")


# The blocks whose keys are checked before pydantic reads the config (an unknown key said with its block and a
# suggestion, not as pydantic's "extra inputs are not permitted"), in the order they are checked; `[]`: each entry
# of a list. A row with a check of values runs it on the block's mapping too: values Ray or sbatch would misread
# (config/cluster_values.py). (`dataset` has its own: validate/datasets.py.)
BLOCKS = (
    ("ray", RayConfig, check_ray_values),
    ("slurm", SlurmConfig, check_slurm_values),
    ("async_eval.sbatch", None, check_eval_sbatch_values),  # (its values before async_eval's keys, as always)
    ("grpo_rollout", GrpoRolloutConfig, None),
    ("rewards", RewardsConfig, None),
    ("rewards.judge", JudgeConfig, None),
    ("environment", EnvironmentConfig, None),
    ("retrieval", RetrievalConfig, None),
    ("retrieval.prompts", RetrievalPrompts, None),
    ("async_eval", AsyncEvalConfig, None),
    ("async_eval.sbatch", SbatchConfig, None),
    ("async_eval.reserved", ReservedEvalConfig, None),
    ("async_eval.failure", EvalFailureConfig, None),
    ("image_processor", ImageProcessorConfig, None),
    ("evals", EvalsConfig, None),
    ("evals.benchmarks[]", BenchmarkConfig, None),
)


def check_block_keys(raw: dict, where: str) -> None:
    """Every block of BLOCKS the config writes as a mapping: its keys, and its values where the row says."""
    for path, model, check_values in BLOCKS:
        for block in _mappings_at(raw, path):
            if model is not None:
                check_keys(block, model.model_fields, where, path)
            if check_values is not None:
                check_values(block, where)


def _mappings_at(raw: dict, path: str) -> list[dict]:
    """The mappings at `path` (`rewards.judge`, `evals.benchmarks[]`): none where a step on the way is not one."""
    found = [raw]
    for key in path.split("."):
        entries = key.endswith("[]")
        key = key.removesuffix("[]")
        found = [item.get(key) for item in found]
        if entries:
            found = [entry for items in found if isinstance(items, list) for entry in items]
        found = [item for item in found if isinstance(item, dict)]
    return found


def check_keys(data: dict, allowed, where: str, block: str) -> None:
    for key in data:
        if key not in allowed:
            raise LeapError(
                f"unknown key '{key}' in {block}",
                where=where,
                fix=unknown_key_fix(str(key), allowed),
            )


def pydantic_error(err: ValidationError, where: str, prefix: str = "") -> LeapError:
    first = err.errors()[0]
    loc = ".".join([prefix] * bool(prefix) + [str(p) for p in first["loc"]])
    got = first.get("input")
    got_text = f" (got {'null' if got is None else repr(got)})" if not isinstance(got, dict) else ""
    more = f" [and {err.error_count() - 1} more problem(s)]" if err.error_count() > 1 else ""
    fix = "see docs/config.md for every key, its type and default"
    if first["type"] == "missing":
        return LeapError(f"required key '{loc}' is missing{more}", where=where, fix=fix)
    from leap_finetune.config.numbers import explain
    from leap_finetune.config.schema_base import block_model

    number = explain(block_model(err.title), first, prefix)  # a number's type or range: said in our words
    if number is not None:
        return LeapError(f"{number[0]}{more}", where=where, fix=number[1])
    message = first["msg"].removeprefix("Value error, ")  # (our own validators' words, without pydantic's label)
    expected = (first.get("ctx") or {}).get("expected")
    if first["type"] == "literal_error" and isinstance(got, str) and expected:
        from leap_finetune.config.suggest import did_you_mean

        hint = did_you_mean(got, [e.strip().strip("'") for e in expected.replace(" or ", ", ").split(",")])
        fix = f"{hint} ({fix})" if hint else fix
    from leap_finetune.config.suggest import yaml_read_as

    yaml_read = yaml_read_as(got) if first["type"] == "string_type" else None
    if yaml_read:  # (YAML 1.1: no/yes/on/off are booleans, 12:00:00 a base-60 number, 2026-01-01 a date)
        message, got_text = "expected text", f" (got {yaml_read})"
        parts = loc.split(".")
        item = len(parts) > 1 and parts[-1].isdigit()  # (a list item: `setup: ['...']`, not `0: '...'`)
        example = f"{parts[-2]}: ['...']" if item else f"{parts[-1]}: '...'"
        fix = f"put the text in quotes, e.g. {example} (YAML reads it unquoted as a value)"
    if first["type"] in ("dict_type", "model_type", "model_attributes_type"):
        # (pydantic names the class: "a valid dictionary or instance of ImageProcessorConfig")
        message = "expected a mapping of its keys"
        fix = f"give {loc or 'it'} a mapping of its keys, e.g. `{loc or 'training_config'}: {{key: value}}` (docs/config.md)"
    from leap_finetune.config.schema_base import FIX_MARK

    if FIX_MARK in message:  # (the validator said how to fix it)
        message, _, fix = message.partition(FIX_MARK)
    return LeapError(f"{loc}: {message}{got_text}{more}", where=where, fix=fix)


def trainer_arg_fields(training_type: str) -> set[str]:
    """The keyword arguments the training type's TRL config class accepts (memo.py: TRL is imported only when the
    installed libraries changed)."""
    from leap_finetune.memo import remembered

    def fields() -> list[str]:
        return sorted(f.name for f in dataclasses.fields(METHODS[training_type].arguments_class()) if f.init)

    return set(remembered("fields", training_type, fields))
