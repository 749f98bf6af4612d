"""`peft_config` (LoRA): the profile (`extends`) under the user's options, each an option of peft's LoraConfig, and
`use_peft: false` for a full fine-tune, `quantization` for QLoRA (config/quantization.py), `lora_experts` for a
mixture of experts' experts (config/lora.py peft_options); the values are checked in config/lora.py."""

from __future__ import annotations

import dataclasses

from leap_finetune.config import profiles
from leap_finetune.config.lora import check_lora_values
from leap_finetune.config.quantization import quantization_of
from leap_finetune.config.suggest import unknown_key_fix
from leap_finetune.errors import LeapError


def resolve_peft(peft_config: dict | None, where: str, vision: bool = False) -> tuple[dict | None, dict | None]:
    """(the LoRA options, the base's quantization_config for QLoRA or None)."""
    if peft_config is None:
        return None, None
    user = dict(peft_config)
    profile_name = user.pop("extends", None) or ("DEFAULT_VLM_LORA" if vision else "DEFAULT_LORA")
    if profile_name in profiles.TRAINING_PROFILES:
        raise LeapError(
            f"{profile_name} is a profile of training_config (the trainer's settings), not of peft_config",
            where=where,
            fix=f"move it: training_config: {{extends: {profile_name}}}; peft_config's profiles: "
            + ", ".join(profiles.PEFT_PROFILES),
        )
    if profile_name not in profiles.PEFT_PROFILES:
        raise LeapError(
            f"unknown profile '{profile_name}' in peft_config.extends",
            where=where,
            fix=unknown_key_fix(str(profile_name), profiles.PEFT_PROFILES),
        )
    from peft import LoraConfig

    allowed = {f.name for f in dataclasses.fields(LoraConfig) if f.init} | {"use_peft", "quantization", "lora_experts"}
    for key in user:
        if key not in allowed:
            raise LeapError(
                f"unknown key '{key}' in peft_config (not an option of peft's LoraConfig)",
                where=where,
                fix=unknown_key_fix(key, allowed),
            )
    merged = profiles.peft_profile(profile_name)
    merged.update(user)
    use_peft = merged.pop("use_peft", True)
    if not isinstance(use_peft, bool):
        raise LeapError(
            f"peft_config.use_peft is {use_peft!r}: expected true or false",
            where=where,
            fix="use_peft: true (LoRA) or false (a full fine-tune)",
        )
    quantization = quantization_of(merged, where)
    experts = merged.pop("lora_experts", False)
    if not isinstance(experts, bool):
        raise LeapError(
            f"peft_config.lora_experts is {experts!r}: expected true or false",
            where=where,
            fix="lora_experts: true adapts a mixture of experts' experts too (docs/moe.md)",
        )
    if experts:
        _check_expert_options(user, merged, where)
    if not use_peft:
        if quantization is not None:
            raise LeapError(
                "peft_config.quantization is set with use_peft: false: a quantized base trains only through LoRA",
                where=where,
                fix="remove quantization for a full fine-tune, or use_peft: true for QLoRA",
            )
        return None, None
    checked = check_lora_values(merged, where)
    return ({**checked, "lora_experts": True} if experts else checked), quantization


def _check_expert_options(user: dict, merged: dict, where: str) -> None:
    """peft's adapters on 3-D expert weights (ParamWrapper) take no dropout, DoRA, LoRA bias or fan_in_fan_out: one
    the user set is refused now (peft would refuse it once the model is loaded); a profile's dropout becomes 0
    (DEFAULT_LORA's is 0 already)."""
    for key, off in (("lora_dropout", 0), ("use_dora", False), ("lora_bias", False), ("fan_in_fan_out", False)):
        if user.get(key) not in (None, off, 0.0):
            raise LeapError(
                f"peft_config.{key} is {user[key]!r} with lora_experts: true: peft's adapters on expert weights "
                f"cannot apply it",
                where=where,
                fix=f"remove {key} (or set it to {str(off).lower()}), or lora_experts: false",
            )
    merged["lora_dropout"] = 0.0
