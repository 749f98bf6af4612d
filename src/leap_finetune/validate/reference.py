"""The config reference (docs/config.md), generated from the schema and the profiles so the docs
never drift from the code. Regenerate: python scripts/gen_config_docs.py

The prose is a Markdown template (reference.md.template, beside this file); each `${...}` in it is a table
written from the code:
- `${fields:PATH}`: the keys of the block at PATH of the top-level model (`${fields:async_eval.sbatch}`; the top
  level itself is `${fields:}`), named as the user writes them (`async_eval.sbatch.time`); `${entries:PATH}`: the
  keys of each entry of a list (`evals.benchmarks`), named alone;
- `${profiles:BLOCK}`, `${managed:BLOCK}`: the built-in profiles and the keys leap-finetune sets itself, of
  `training_config` or `peft_config`;
- `${own_keys}`: leap-finetune's own training_config keys (config/own_keys.py), and the other names below.
A `$` of the prose itself is written `$$`.
"""

from __future__ import annotations

import string
import types
from pathlib import Path
from typing import Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from leap_finetune.config import arguments, lora, model_init, own_keys, profiles
from leap_finetune.config.schema import LeapConfigModel
from leap_finetune.methods import METHODS, training_types
from leap_finetune.validate.training import MANAGED_TRAINING_KEYS

TEMPLATE = Path(__file__).with_name("reference.md.template")


class _Template(string.Template):
    braceidpattern = r"(?a:[_a-z][_a-z0-9]*(?::[_a-z0-9.]*)?)"  # a name, and what it is of: `fields:rewards.judge`


def render_reference() -> str:
    return _Template(TEMPLATE.read_text(encoding="utf-8")).substitute(_Tables())


class _Tables:
    """The template's `${name:argument}` -> its text (string.Template asks a mapping for each)."""

    def __getitem__(self, placeholder: str) -> str:
        name, _, argument = placeholder.partition(":")
        return "\n".join(getattr(self, name)(argument))

    def fields(self, path: str) -> list[str]:
        return _fields_table(_block_at(path), f"{path}." if path else "")

    def entries(self, path: str) -> list[str]:
        return _fields_table(_block_at(path))

    def training_types(self, _) -> list[str]:
        return [", ".join(f"`{t}`" for t in training_types())]

    def supported_types(self, _) -> list[str]:  # (every registered type is supported in this version)
        return self.training_types(_)

    def config_classes(self, _) -> list[str]:
        rows = [f"| `{name}` | {_config_class_name(name)} |" for name in training_types()]
        return ["| training_type | config class |", "| --- | --- |", *rows]

    def ranges(self, _) -> list[str]:
        rows = [f"| `{key}` | {expected} |" for key, (_, expected) in arguments.RANGES.items()]
        return ["| key | expected |", "| --- | --- |", *rows]

    def own_keys(self, _) -> list[str]:
        rows = [
            f"| `{key}` | {own_keys.values_text(key)} | {field.description} |" for key, field in own_keys.KEYS.items()
        ]
        return ["| key | values | meaning |", "| --- | --- | --- |", *rows]

    def managed(self, block: str) -> list[str]:
        managed = {"training_config": MANAGED_TRAINING_KEYS, "peft_config": lora.MANAGED}[block]
        return [f"- `{key}`: {why}" for key, why in managed.items()]

    def profiles(self, block: str) -> list[str]:
        named = {"training_config": profiles.TRAINING_PROFILES, "peft_config": profiles.PEFT_PROFILES}[block]
        lines = []
        for name, values in named.items():
            lines += [f"### `{name}`", "", "| key | value |", "| --- | --- |"]
            lines += [f"| `{k}` | `{v!r}` |" for k, v in values.items()]
            lines.append("")
        return lines[:-1]  # (the template puts the blank line after the last one)

    def model_init_kwargs(self, _) -> list[str]:
        forwarded = (
            "- forwarded: `dtype`, "
            + ", ".join(f"`{k}`" for k in model_init.FORWARDED)
            + "; of these, "
            + ", ".join(f"`{k}`" for k in model_init.TOKENIZER_KEYS)
            + " go to the tokenizer too"
        )
        return [forwarded, *[f"- refused: `{key}`: {why}" for key, why in model_init.REFUSED.items()]]

    def tiny_model_init_kwargs(self, _) -> list[str]:
        return [" and ".join(f"`{k}`" for k in model_init.TINY_KEYS)]


def _block_at(path: str) -> type[BaseModel]:
    """The model of the block at `path` (`async_eval.sbatch`) of the top level; the top level for ''."""
    model = LeapConfigModel
    for key in filter(None, path.split(".")):
        model = _model_in(model.model_fields[key].annotation)
    return model


def _model_in(annotation) -> type[BaseModel]:
    """The block's model inside a field's type (`DatasetConfig | list[DatasetConfig] | None`: DatasetConfig)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(_model_in(a) for a in get_args(annotation) if _has_model(a))


def _has_model(annotation) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_has_model(a) for a in get_args(annotation))


def _type_name(annotation) -> str:
    """A field's type in the user's words: `a` \\| `b` for the allowed values, "mapping (below)" for a block."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{value}`" for value in args)
    if origin in (Union, types.UnionType):
        named = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (below)"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("|", "\\|")


def _fields_table(model: type[BaseModel], prefix: str = "") -> list[str]:
    lines = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, field in model.model_fields.items():
        if field.default is PydanticUndefined and field.default_factory is None:
            default = "**required**"
        elif field.default_factory is not None:
            made = field.default_factory()
            default = f"`{made!r}`" if isinstance(made, (list, dict)) else "(its keys' defaults)"
        else:
            default = f"`{field.default!r}`" if field.default is not None else "`null`"
        lines.append(f"| `{prefix}{name}` | {_type_name(field.annotation)} | {default} | {field.description or ''} |")
    return lines


def _config_class_name(training_type: str) -> str:
    """`SFTConfig` (TRL), `SentenceTransformerTrainingArguments` (sentence-transformers), ...: read from the recipe
    itself, so a new training type cannot be left out of the reference."""
    cls = METHODS[training_type].arguments_class()
    library = {"trl": "TRL", "sentence_transformers": "sentence-transformers"}.get(
        cls.__module__.split(".")[0], cls.__module__.split(".")[0]
    )
    return f"{library}'s `{cls.__name__}`"
