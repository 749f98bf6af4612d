"""`peft_config`: LoRA options checked and built into peft's `LoraConfig` by the driver.

peft accepts `r: 0`, `lora_alpha: lots` or `lora_dropout: 1.7` and fails (or trains nothing) once the
model is wrapped; here each option is typed from `LoraConfig`'s own fields, the values we know the
bounds of are range-checked, and the `LoraConfig` itself is built, so `validate` sees what `run`
would. Whether `target_modules` name modules of the model is checked against the model's structure
in `models/structure.py` (no weights are loaded).
"""

from __future__ import annotations

import dataclasses
import typing

from leap_finetune.errors import LeapError

TASK_TYPE = "CAUSAL_LM"
# leap-finetune's key (not peft's) and the fields leap-finetune sets itself.
MANAGED = {
    "task_type": f"leap-finetune sets it from the training type ({TASK_TYPE} for sft, dpo and kto)",
    "base_model_name_or_path": "set the top-level model_name",
    "inference_mode": "training needs inference_mode: false",
    "peft_type": "peft_config is LoRA",
}
RANGES = {
    "r": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        "a whole number >= 1 (8, 16, 32 are usual)",
    ),
    "lora_alpha": (lambda v: _is_number(v) and v > 0, "a number > 0 (often 2 x r)"),
    "lora_dropout": (lambda v: _is_number(v) and 0 <= v < 1, "a probability in [0, 1), e.g. 0.05"),
}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_lora_values(values: dict, where: str) -> dict:
    """Type- and range-check the merged LoRA options and build a LoraConfig from them."""
    from peft import LoraConfig

    from leap_finetune.config.arguments import _Invalid, _parse

    hints = typing.get_type_hints(LoraConfig)
    fields = {f.name: f for f in dataclasses.fields(LoraConfig) if f.init}
    checked = {}
    for key, value in values.items():
        if key in MANAGED:
            if key == "task_type" and value == TASK_TYPE:
                continue
            raise LeapError(
                f"peft_config.{key} is decided by leap-finetune", where=where, fix=f"remove it: {MANAGED[key]}"
            )
        if key in RANGES:
            if isinstance(value, str):  # "16" or "0.05" as text: coerce as for training_config
                try:
                    value = float(value) if "." in value or "e" in value.lower() else int(value)
                except ValueError:
                    pass
            if key == "r" and isinstance(value, float) and value.is_integer():
                value = int(value)
            ok, expected = RANGES[key]
            if not ok(value):
                raise LeapError(
                    f"peft_config.{key} is {value!r}: expected {expected}",
                    where=where,
                    fix=f"set peft_config.{key} to {expected}",
                )
        elif key in fields:
            try:
                value = _parse(value, None, hints[key], fields[key])
            except _Invalid as err:
                raise LeapError(
                    f"peft_config.{key} is {value!r}: expected {err}",
                    where=where,
                    fix=f"see peft's LoraConfig documentation for {key}",
                ) from None
        checked[key] = value
    try:
        LoraConfig(task_type=TASK_TYPE, **checked)
    except (ValueError, TypeError) as err:
        raise LeapError(
            f"peft's LoraConfig refuses these options: {err}",
            where=f"{where}: peft_config",
            fix="see peft's LoraConfig documentation",
        ) from None
    return checked
