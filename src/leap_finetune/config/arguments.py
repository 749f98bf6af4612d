"""Typed values for `training_config`: parsed the way transformers parses its own arguments.

`HfArgumentParser` turns each field of a TRL config class into an argparse option with a type
(int, float, bool, str, an enum's values as choices). We read those options and apply them to
the YAML values, so `learning_rate: fast` or `per_device_train_batch_size: 2.5` is an error that
names the key at `validate`, instead of a traceback from the optimizer after the model loaded.
Text that is a valid value is coerced (`learning_rate: "1e-3"` becomes 1e-3), as on a command line.

Ranges are ours: transformers accepts `learning_rate: -0.1` or `gradient_accumulation_steps: 0` and
fails (or silently trains nothing) later. `RANGES` lists the keys whose bounds we know.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from collections.abc import Callable

from leap_finetune.config.suggest import did_you_mean
from leap_finetune.errors import LeapError

# key -> (check, what is expected). A value of None passes when the field allows None.
RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "learning_rate": (lambda v: v > 0, "a number > 0, e.g. 2e-5"),
    "num_train_epochs": (lambda v: v > 0, "a number > 0"),
    "max_steps": (lambda v: v > 0 or v == -1, "a whole number > 0, or -1 to train for num_train_epochs"),
    "per_device_train_batch_size": (lambda v: v >= 1, "a whole number >= 1"),
    "per_device_eval_batch_size": (lambda v: v >= 1, "a whole number >= 1"),
    "gradient_accumulation_steps": (lambda v: v >= 1, "a whole number >= 1"),
    "eval_accumulation_steps": (lambda v: v >= 1, "a whole number >= 1"),
    # (0 divides by zero in TRL's collator; a negative one fails in torch's padding)
    "pad_to_multiple_of": (lambda v: v >= 1, "a whole number >= 1, e.g. 8 (or null: no padding to a multiple)"),
    "warmup_steps": (
        lambda v: v >= 0 and (v < 1 or v == int(v)),
        "a whole number of steps >= 0, or a fraction of the total steps in [0, 1)",
    ),
    "warmup_ratio": (lambda v: 0 <= v <= 1, "a fraction in [0, 1]"),
    "weight_decay": (lambda v: v >= 0, "a number >= 0"),
    "max_grad_norm": (lambda v: v >= 0, "a number >= 0 (0 turns clipping off)"),
    "adam_beta1": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "adam_beta2": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "adam_epsilon": (lambda v: v > 0, "a number > 0"),
    "logging_steps": (
        lambda v: v > 0 and (v < 1 or v == int(v)),
        "a whole number > 0, or a fraction of the total steps in (0, 1)",
    ),
    "save_steps": (
        lambda v: v > 0 and (v < 1 or v == int(v)),
        "a whole number > 0, or a fraction of the total steps in (0, 1)",
    ),
    "eval_steps": (
        lambda v: v > 0 and (v < 1 or v == int(v)),
        "a whole number > 0, or a fraction of the total steps in (0, 1)",
    ),
    "save_total_limit": (lambda v: v >= 1, "a whole number >= 1 (or null to keep every checkpoint)"),
    "max_length": (lambda v: v >= 1, "a whole number of tokens >= 1 (or null for no limit)"),
    # GRPO (0 reaches transformers' generate as max_new_tokens 0: a traceback after the model loaded)
    "max_completion_length": (lambda v: v >= 1, "a whole number of tokens >= 1"),
    "seed": (lambda v: v >= 0, "a whole number >= 0"),
    "data_seed": (lambda v: v >= 0, "a whole number >= 0"),
    "dataloader_num_workers": (lambda v: v >= 0, "a whole number >= 0"),
    "label_smoothing_factor": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "neftune_noise_alpha": (lambda v: v > 0, "a number > 0"),
    # DPO / KTO
    "beta": (lambda v: v > 0, "a number > 0 (0.1 is usual)"),
    "label_smoothing": (lambda v: 0 <= v <= 0.5, "a number in [0, 0.5]"),
    "desirable_weight": (lambda v: v > 0, "a number > 0"),
    "undesirable_weight": (lambda v: v > 0, "a number > 0"),
    "rpo_alpha": (lambda v: v >= 0, "a number >= 0"),
}

_TRUE = {"true", "yes", "y", "on", "1"}
_FALSE = {"false", "no", "n", "off", "0"}


class _Invalid(ValueError):
    """The value does not have the field's type; the message says what was expected."""

    def article(self) -> str:
        text = str(self)
        return "one of the values listed" if text.startswith("one of") else text


@functools.cache
def _options(config_cls) -> dict:
    """field name -> argparse action, as transformers' HfArgumentParser builds them."""
    from transformers import HfArgumentParser

    try:
        parser = HfArgumentParser(config_cls)
    except ValueError:
        # A field argparse cannot express (sentence-transformers' ColBERT `max_length`: a number or a dict per
        # side): the parser is built over the other fields; such a field's value is checked by the class itself.
        parser = HfArgumentParser(_parseable_fields(config_cls))
    actions = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in actions and action.dest != "help":
            actions[action.dest] = action
    return actions


def _parseable_fields(config_cls):
    hints = typing.get_type_hints(config_cls)

    def parseable(hint) -> bool:
        if typing.get_origin(hint) not in (typing.Union, types.UnionType):
            return True
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(args) <= 1 or str in args

    fields = []
    for f in dataclasses.fields(config_cls):
        if not f.init or not parseable(hints[f.name]):
            continue
        default = (
            {"default": f.default}
            if f.default is not dataclasses.MISSING
            else {"default_factory": f.default_factory}
            if f.default_factory is not dataclasses.MISSING
            else {}
        )
        fields.append((f.name, hints[f.name], dataclasses.field(metadata=f.metadata, **default)))
    return dataclasses.make_dataclass(f"{config_cls.__name__}Parseable", fields)


@functools.cache
def _hints(config_cls) -> dict:
    return typing.get_type_hints(config_cls)


def _members(hint) -> set:
    """The types a (possibly Optional / Union) hint accepts, with list[...] and dict[...] as list / dict."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_members(arg) for arg in typing.get_args(hint)))
    if origin is typing.Literal:
        return set()  # see _literals
    if origin is not None:
        return {origin}
    return {hint}


def _literals(hint) -> list:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return list(typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return [value for arg in typing.get_args(hint) for value in _literals(arg)]
    return []


# Fields whose accepted values TRL lists only in the field's help ("Possible values are: `'sigmoid'`, ...");
# TRL itself finds out at the first training step.
CHOICES_IN_HELP = ("loss_type",)


def _help_choices(field: dataclasses.Field) -> list[str]:
    import re

    if field.name not in CHOICES_IN_HELP:
        return []
    return list(dict.fromkeys(re.findall(r"`'([\w\-]+)'`", field.metadata.get("help", ""))))


def check_training_values(config_cls, values: dict, where: str) -> dict:
    """Every key of `values` checked (and coerced) against the field of `config_cls` it sets, then
    against RANGES. Keys that are not fields of `config_cls` (leap-finetune's own) pass through."""
    options = _options(config_cls)
    hints = _hints(config_cls)
    fields = {f.name: f for f in dataclasses.fields(config_cls) if f.init}
    checked = {}
    for key, value in values.items():
        if key not in fields:
            checked[key] = value
            continue
        try:
            value = _parse(value, options.get(key), hints[key], fields[key])
        except _Invalid as err:
            from leap_finetune.config.suggest import yaml_read_as

            yaml_read = yaml_read_as(value) if "text" in str(err) or "one of" in str(err) else None
            raise LeapError(
                f"training_config.{key} is {value!r}: expected {err}"
                + (f"; YAML read what you wrote as {yaml_read}" if yaml_read else ""),
                where=where,
                fix=f"give training_config.{key} {err.article()} (docs/config.md; TRL's {config_cls.__name__} documents "
                "every key)" + ("; put text in quotes" if yaml_read else ""),
            ) from None
        _check_range(key, value, where, config_cls.__name__)
        choices = _help_choices(fields[key])
        given = value if isinstance(value, list) else [value]
        wrong = [v for v in given if choices and v not in choices]
        if wrong:
            hint = did_you_mean(str(wrong[0]), choices)
            raise LeapError(
                f"training_config.{key} is {values[key]!r}: expected one of: {', '.join(choices)}"
                + (f" ({hint})" if hint else ""),
                where=where,
                fix=f"give training_config.{key} one of the values listed",
            )
        checked[key] = value
    return checked


# GRPO's beta weighs a KL term that may be off (TRL's default is 0: no reference model).
RANGES_BY_CONFIG = {"GRPOConfig": {"beta": (lambda v: v >= 0, "a number >= 0 (0: no KL term)")}}


def _check_range(key: str, value, where: str, config_name: str = "") -> None:
    rules = {**RANGES, **RANGES_BY_CONFIG.get(config_name, {})}
    if key not in rules or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    ok, expected = rules[key]
    if not ok(value):
        raise LeapError(
            f"training_config.{key} is {value!r}: expected {expected}",
            where=where,
            fix=f"set training_config.{key} to {expected}",
        )


def _parse(value, action, hint, field: dataclasses.Field):
    members = _members(hint)
    literals = _literals(hint)
    if literals and any(value == v and type(value) is type(v) for v in literals):
        return value
    if literals and not (members - {type(None)}) and value is not None:
        hint_text = did_you_mean(str(value), [str(v) for v in literals])
        raise _Invalid("one of: " + ", ".join(str(v) for v in literals) + (f" ({hint_text})" if hint_text else ""))
    if value is None:
        if type(None) in members or field.default is None:
            return None
        raise _Invalid(_describe(action, members))
    if isinstance(value, dict):
        if dict in members:
            return value
        raise _Invalid(_describe(action, members))
    if isinstance(value, list):
        if list not in members:
            raise _Invalid(_describe(action, members) + ", not a list")
        return [_scalar(item, action, members - {list, dict, type(None)} or {str}) for item in value]
    if members <= {list, type(None)}:  # a list field given one value: transformers wraps it too
        return [_scalar(value, action, {str})]
    return _scalar(value, action, members)


def _scalar(value, action, members: set):
    kind = getattr(action, "type", None) if action is not None else None
    choices = getattr(action, "choices", None) if action is not None else None
    if choices:
        text = value.value if hasattr(value, "value") else value
        if str(text) in {str(c) for c in choices}:
            return text
        hint = did_you_mean(str(text), [str(c) for c in choices])
        raise _Invalid("one of: " + ", ".join(str(c) for c in choices) + (f" ({hint})" if hint else ""))
    if bool in members and (isinstance(value, bool) or (isinstance(value, str) and value.lower() in _TRUE | _FALSE)):
        if isinstance(value, bool):
            return value
        if str not in members:
            return value.lower() in _TRUE
    if int in members and float not in members:
        return _integer(value, members)
    if float in members:
        return _number(value, members)
    if str in members:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    if kind is not None and kind not in (str, int, float) and isinstance(value, str):
        try:  # an enum-like argparse type (e.g. DebugOption)
            kind(value)
            return value
        except (ValueError, KeyError, argparse.ArgumentTypeError):
            pass
    raise _Invalid(_describe(action, members))


def _integer(value, members: set) -> int:
    if isinstance(value, bool):
        raise _Invalid("a whole number")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
        if str in members:
            return value
    raise _Invalid("a whole number")


def _number(value, members: set) -> float | int:
    if isinstance(value, bool):
        raise _Invalid("a number")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            if str in members:
                return value
            raise _Invalid("a number") from None
        return (
            int(number)
            if int in members and number.is_integer() and "." not in value and "e" not in value.lower()
            else number
        )
    raise _Invalid("a number")


def _describe(action, members: set) -> str:
    names = []
    for kind, kind_names in (
        (bool, ["true", "false"]),
        (int, ["a whole number"]),
        (float, ["a number"]),
        (str, ["text"]),
        (dict, ["a mapping"]),
        (list, ["a list"]),
    ):
        if kind in members and not (kind is int and float in members):
            names += kind_names
    if type(None) in members:
        names.append("null")
    if not names:
        return "a value of the right type"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
