"""Numbers in the config blocks, and how a wrong one is said.

YAML's `true` is not a number (pydantic would read it as 1), `.nan` is no value, and a wrong number is said as
the key, the value and what is expected (`rewards.judge.retries is 1.5: expected a whole number >= 0`), with no
pydantic wording in between. Every block's model (schema_base.StrictModel) checks its fields with `check_field`;
`explain` turns pydantic's first error into the message (validate/keys.py's `pydantic_error`).
"""

from __future__ import annotations

import math
import types
import typing

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic_core import PydanticCustomError

# pydantic's own error types about a number's type or range
NUMBER_ERRORS = {
    "int_type",
    "int_parsing",
    "int_from_float",
    "float_type",
    "float_parsing",
    "finite_number",
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
}
LEAP_VALUE = "leap_value"  # our own: ctx holds `shown` (the value), `expected`, and maybe `index`, `fix`


def kinds(annotation) -> set:
    """The plain types an annotation allows, unions and Optional unwrapped (list[int] -> {list})."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(kinds(member) for member in typing.get_args(annotation)))
    if origin is typing.Annotated:
        return kinds(typing.get_args(annotation)[0])
    return {origin or annotation}


def list_item(annotation):
    """X of a list[X] the annotation allows (None when it allows no typed list)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for member in typing.get_args(annotation) if union else (annotation,):
        if typing.get_origin(member) is list and typing.get_args(member):
            return typing.get_args(member)[0]
    return None


def _numeric(annotation) -> bool:
    allowed = kinds(annotation)
    return bool(allowed & {int, float}) and bool not in allowed


def describe(annotation, metadata=()) -> str:
    """What a numeric field expects, in words: `a whole number >= 0`, `a number from 0 to 1`."""
    allowed = kinds(annotation)
    text = "a number" if float in allowed else "a whole number"
    bounds = {type(m): m for m in metadata if isinstance(m, (Gt, Ge, Lt, Le))}
    low = f"> {plain(bounds[Gt].gt)}" if Gt in bounds else f">= {plain(bounds[Ge].ge)}" if Ge in bounds else None
    high = f"< {plain(bounds[Lt].lt)}" if Lt in bounds else f"<= {plain(bounds[Le].le)}" if Le in bounds else None
    whole = float not in allowed
    if low and high and (whole or (Ge in bounds and Le in bounds)):  # whole numbers: 0 < n < 65536 is 1 to 65535
        first = bounds[Ge].ge if Ge in bounds else bounds[Gt].gt + 1
        last = bounds[Le].le if Le in bounds else bounds[Lt].lt - 1
        text += f" from {plain(first)} to {plain(last)}"
    elif low or high:
        text += " " + " and ".join(p for p in (low, high) if p)
    return text


def shown(value) -> str:
    """A value as the user wrote it in YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    return repr(value)


def _refuse(value, expected: str, index: int | None = None):
    raise PydanticCustomError(
        LEAP_VALUE,
        "{shown} is not {expected}",
        {"shown": shown(value), "expected": expected, **({"index": index} if index is not None else {})},
    )


def check_field(value, field) -> object:
    """A field's value before pydantic reads it: a boolean or NaN where a number is expected is refused (also as
    an item of a list of numbers); anything else is left to pydantic."""
    annotation = field.annotation
    if _numeric(annotation) and _not_a_number(value):
        _refuse(value, _finite(describe(annotation, field.metadata)))
    item = list_item(annotation)
    if item is not None and _numeric(item) and isinstance(value, list):
        for index, entry in enumerate(value):
            if _not_a_number(entry):
                _refuse(entry, _finite(describe(item)), index)
    return value


def _finite(expected: str) -> str:
    return expected.replace("a number", "a finite number", 1)


def _not_a_number(value) -> bool:
    return isinstance(value, bool) or isinstance(value, float) and math.isnan(value)


def explain(model: type[BaseModel] | None, error: dict, prefix: str = "") -> tuple[str, str] | None:
    """(message, fix) for pydantic's error about a number's type or range, or ours; None for other errors."""
    kind = error["type"]
    if kind != LEAP_VALUE and kind not in NUMBER_ERRORS:
        return None
    field, key = _field_at(model, error["loc"], prefix)
    ctx = error.get("ctx") or {}
    if kind == LEAP_VALUE:
        key += f"[{ctx['index']}]" if "index" in ctx else ""
        return f"{key} is {ctx['shown']}: expected {ctx['expected']}", ctx.get("fix") or f"give {key} {ctx['expected']}"
    if field is None:
        return None
    annotation, metadata = field.annotation, field.metadata
    item = list_item(annotation)
    if isinstance(error["loc"][-1], int) and item is not None:
        annotation, metadata = item, ()
    if not kinds(annotation) & {int, float}:
        return None
    expected = describe(annotation, metadata)
    if kind == "finite_number":
        expected = _finite(expected)
    return f"{key} is {shown(error.get('input'))}: expected {expected}", f"give {key} {expected}"


def _field_at(model, loc: tuple, prefix: str):
    """The field a pydantic location points at, and the key as the user writes it (`rewards.weights[1]`); the
    names pydantic adds for the members of a union are left out."""
    parts = [prefix] if prefix else []
    field = None
    for part in loc:
        if isinstance(part, int):
            parts[-1:] = [f"{parts[-1]}[{part}]"] if parts else [f"[{part}]"]
            continue
        if model is not None and part not in model.model_fields:
            continue  # a union member's tag (`RewardsConfig`, `list[...]`, `str`)
        field = model.model_fields[part] if model is not None else None  # (None: a mapping's key)
        parts.append(str(part))
        model = next(_models(field.annotation), None) if field is not None else None
    return field, ".".join(parts)


def _models(annotation):
    item = list_item(annotation)
    for kind in kinds(annotation) | (kinds(item) if item is not None else set()):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield kind


def plain(number) -> str:
    """2.0 as 2, 0.5 as 0.5."""
    return str(int(number)) if float(number).is_integer() else str(number)
