"""The keys of a vision-language run (LFM2-VL), checked once the model is known to be one.

- training_config: `train_vision_encoder`, `train_projector`, `train_language_model` (bools) and
  `vision_encoder_lr_multiplier` (a number > 0): filled in from the defaults for a full fine-tune
  (everything trains, the vision encoder at 0.1x) or LoRA (adapters on the language model only), so the
  resolved config - and `plan` - say exactly what trains.
- LoRA: a list of target module names is narrowed to the language model (SigLIP2's attention has the same
  names as LFM2's: q/k/v/out_proj), as DEFAULT_VLM_LORA's regular expression does.
- `image_processor:`: the processor's own settings (LFM2-VL's Lfm2VlImageProcessor), used to count each
  image's tokens while the rows are checked, to build the batches, and saved with the trained model.

A text model given any of these is told they belong to vision-language models.
"""

from __future__ import annotations

import re

from leap_finetune.config import profiles
from leap_finetune.errors import LeapError
from leap_finetune.methods import VISION_KEYS, method_of

# the language model's layers, as module names of Lfm2VlForConditionalGeneration (model.language_model.layers...)
LANGUAGE_MODEL_MODULES = r".*language_model.*\.({names})"
# the linear layers of an LFM2 decoder layer: attention, short convolution, SwiGLU MLP
LFM2_LINEAR = ("q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3")


def check_vision_keys(model, vision: bool, where: str) -> None:
    """Vision keys (training_config's, `image_processor:`, `dataset.image_root`) on a text model, or on a type
    that does not read images: say where they belong."""
    training_type, model_name = model.training_type, model.model_name
    given = [f"training_config.{key}" for key in VISION_KEYS if key in model.training_config]
    if model.image_processor is not None:
        given.append("image_processor")
    datasets = model.dataset if isinstance(model.dataset, list) else [model.dataset]
    given += ["dataset.image_root" for item in datasets if item is not None and item.image_root][:1]
    if not given:
        return
    if not method_of(training_type).images:
        raise LeapError(
            f"{given[0]} applies to image training (sft, dpo or grpo with a vision-language model); "
            f"training_type is {training_type}",
            where=where,
            fix=f"remove {given[0]}",
        )
    if not vision:
        raise LeapError(
            f"{given[0]} applies to vision-language models, and '{model_name}' is a text model",
            where=where,
            fix=f"remove {given[0]}, or set model_name to a vision-language model (LiquidAI/LFM2-VL-450M, "
            "LiquidAI/LFM2.5-VL-1.6B, tiny-lfm2.5-vl)",
        )


def resolve_vision(training_type: str, training: dict, peft: dict | None, vision: bool, where: str) -> dict | None:
    """Fill in and check the vision keys of `training` (in place) and narrow LoRA's targets; returns the
    peft options. Nothing changes for a text model."""
    if not vision or not method_of(training_type).images:
        for key in VISION_KEYS:
            training.pop(key, None)  # (a profile's defaults; the user's own were refused by check_vision_keys)
        return peft
    defaults = dict(profiles.VLM_LORA_TRAINS) if peft is not None else dict.fromkeys(VISION_KEYS[:3], True)
    defaults["vision_encoder_lr_multiplier"] = 0.1
    for key, value in defaults.items():
        training.setdefault(key, value)  # (the user's own are true or false: validate/training.py's check_key)
    multiplier = training["vision_encoder_lr_multiplier"]
    if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or not multiplier > 0:
        raise LeapError(
            f"training_config.vision_encoder_lr_multiplier is {multiplier!r}",
            where=where,
            fix="give a number > 0: the vision encoder's learning rate as a multiple of learning_rate (default 0.1)",
        )
    for key in ("packing", "eval_packing"):
        if training.get(key):
            raise LeapError(
                f"training_config.{key} joins rows into fixed-length blocks, which would cut pictures apart; rows "
                "with images are not packed",
                where=where,
                fix=f"remove {key}: on a GPU image runs use padding-free batches (no padding, no cut rows) by default",
            )
    if not any(training[key] for key in VISION_KEYS[:3]):
        raise LeapError(
            "training_config sets train_vision_encoder, train_projector and train_language_model all to false: "
            "nothing would train",
            where=where,
            fix="set at least one of them to true",
        )
    if peft is None:
        return None
    peft = dict(peft)
    targets = peft.get("target_modules")
    if targets == "all-linear":  # (peft's every linear layer: the vision encoder's and the projector's too)
        targets = list(LFM2_LINEAR)
    if isinstance(targets, list) and targets:
        # (a list matches module names anywhere: SigLIP2's q/k/v/out_proj too)
        peft["target_modules"] = LANGUAGE_MODEL_MODULES.format(names="|".join(re.escape(t) for t in targets))
    # (a regular expression of the user's own is theirs: it may name vision modules on purpose)
    if not training["train_language_model"]:
        raise LeapError(
            "with LoRA, train_language_model: false leaves the adapters nothing to train (they sit on the language "
            "model's layers)",
            where=where,
            fix="remove peft_config for a full fine-tune of the parts you choose, or keep train_language_model: true",
        )
    return peft


def trained_parts(training: dict, peft: dict | None) -> list[tuple[str, str]]:
    """(part, how it trains) for `plan` and the config table: 'full', 'LoRA', 'frozen', 'full (lr x0.1)'."""
    lr = training.get("vision_encoder_lr_multiplier", 0.1)
    vision = "frozen"
    if training.get("train_vision_encoder"):
        vision = "full" + (f" (learning rate x{lr:g})" if lr != 1 else "")
    projector = "full" if training.get("train_projector") else "frozen"
    if peft is not None:
        language = "LoRA" if training.get("train_language_model") else "frozen"
    else:
        language = "full" if training.get("train_language_model") else "frozen"
    return [("vision encoder", vision), ("projector", projector), ("language model", language)]
