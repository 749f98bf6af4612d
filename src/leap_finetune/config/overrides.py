"""`--set KEY=VALUE` on the command line: a value of the YAML, replaced before the config is validated.

KEY is the dotted path of the key in the YAML (`training_config.learning_rate`, `dataset.limit`, and for a
list an index: `dataset[1].weight` or `dataset.1.weight`); VALUE is read as YAML, as in the file (`1e-4`
is a float, `true` a boolean, `[a, b]` a list, `{a: 1}` a mapping, `[]` an empty list, `null` sets null - and a
top-level key set to null is removed: `--set peft_config=null` runs without the block, as a file without it would,
where `peft_config:` with nothing under it in a file is refused as an empty block). The config is then
validated exactly as if the file said it, so an override gets the same errors.
"""

from __future__ import annotations

import re

import yaml

from leap_finetune.config.yaml_io import _ConfigLoader
from leap_finetune.errors import LeapError

EXAMPLE = "--set training_config.learning_rate=1e-4"


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """A copy of `raw` with each override applied, in order (a later one wins)."""
    import copy

    raw = copy.deepcopy(raw)
    for override in overrides:
        key, separator, text = override.partition("=")
        key = key.strip()
        if not separator or not key:
            raise LeapError(
                f"--set {override!r} is not KEY=VALUE",
                where="--set",
                fix=f"write the key's path in the YAML and its value, e.g. {EXAMPLE}",
            )
        try:
            value = yaml.load(text, Loader=_ConfigLoader) if text.strip() else ""  # noqa: S506 - SafeLoader subclass
        except yaml.YAMLError as err:
            raise LeapError(
                f"--set {key}: the value {text!r} is not valid YAML ({getattr(err, 'problem', err)})",
                where="--set",
                fix="write the value as in the YAML file, in quotes for your shell: e.g. "
                "--set 'evals.benchmarks=[]' or --set 'peft_config={extends: DEFAULT_LORA}'",
            ) from None
        parts = _parts(key)
        if len(parts) == 1 and value is None:
            raw.pop(parts[0], None)  # (the block switched off for this run)
            continue
        _set(raw, parts, value, key)
    return raw


def _parts(key: str) -> list:
    parts: list = []
    for piece in key.split("."):
        match = re.fullmatch(r"([^\[\]]*)((?:\[\d+\])*)", piece)
        if not match or (not match.group(1) and not match.group(2)):
            raise LeapError(
                f"--set {key}: '{piece}' is not a key",
                where="--set",
                fix=f"keys are separated by dots, list items by [N] (in quotes for your shell) or .N: e.g. "
                f"{EXAMPLE}, --set 'dataset[1].epochs=2' or --set dataset.1.epochs=2",
            )
        if match.group(1):
            parts.append(int(match.group(1)) if match.group(1).isdigit() else match.group(1))
        parts += [int(i) for i in re.findall(r"\[(\d+)\]", match.group(2))]
    return parts


def _set(node, parts: list, value, key: str) -> None:
    path = []
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        where = ".".join(str(p) for p in path) or "the top level"
        if isinstance(part, int):
            if not isinstance(node, list):
                raise LeapError(
                    f"--set {key}: {where} is not a list (it is {_kind(node)}), so [{part}] names nothing",
                    where="--set",
                    fix="drop the index, or check the key's path in your YAML",
                )
            if part >= len(node):
                raise LeapError(
                    f"--set {key}: {where} has {len(node)} item(s), so [{part}] is not one of them",
                    where="--set",
                    fix=f"use an index from 0 to {len(node) - 1}",
                )
        elif not isinstance(node, dict):
            raise LeapError(
                f"--set {key}: {where} is {_kind(node)}, not a mapping with keys",
                where="--set",
                fix="check the key's path in your YAML",
            )
        if last:
            node[part] = value
            return
        child = node[part] if isinstance(part, int) or part in node else None
        if child is None:
            child = {}
            node[part] = child
        node = child
        path.append(part)


def _kind(value) -> str:
    return {
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)
