"""QLoRA: `peft_config: {extends: DEFAULT_QLORA}` or `peft_config: {quantization: nf4 | fp4 | int8}`.

The LoRA adapters train over a base whose linear layers bitsandbytes loads in 4 or 8 bits. The short name becomes
`training_config.model_init_kwargs.quantization_config` (what transformers' `from_pretrained` takes); a
quantization_config written there by hand works too, but not both at once. The rest of the model (embeddings,
norms, LFM2's short convolutions, the vision tower's non-linear parts) loads in bf16 unless `dtype` says otherwise.
"""

from __future__ import annotations

from leap_finetune.errors import LeapError

# nf4 with double quantization and bf16 compute: QLoRA's recipe (Dettmers et al. 2023) as TRL, Axolotl and
# Unsloth default to it. fp4 is bitsandbytes' other 4-bit type; int8 is LLM.int8() (more memory, closer to bf16).
QUANTIZATIONS = {
    "nf4": {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    },
    "fp4": {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "fp4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    },
    "int8": {"load_in_8bit": True},
}
INSTALL = "pip install 'leap-finetune[qlora]' (bitsandbytes)"


def quantization_of(peft: dict | None, where: str) -> dict | None:
    """The quantization_config a peft_config's `quantization` names (taken out of `peft`: it is not a LoRA option),
    or None."""
    if peft is None or "quantization" not in peft:
        return None
    name = peft.pop("quantization")
    if name is None or name == "none":
        return None
    if name not in QUANTIZATIONS:
        from leap_finetune.config.suggest import did_you_mean

        hint = did_you_mean(str(name), QUANTIZATIONS)
        raise LeapError(
            f"peft_config.quantization is {name!r}",
            where=where,
            fix=(hint + " " if hint else "") + "expected nf4 (QLoRA), fp4, int8, or none (plain LoRA)",
        )
    return dict(QUANTIZATIONS[name])


# A vision-language model's vision tower and projector stay unquantized (they are small, and train_vision_encoder /
# train_projector train them in full); lm_head is transformers' own default skip, which a skip list replaces.
VISION_SKIPS = ["lm_head", r".*\.vision_tower", r".*\.multi_modal_projector"]  # (matched from the name's start)


def add_quantization(kwargs: dict, quantization: dict | None, *, vision: bool, where: str) -> dict:
    """model_init_kwargs with the peft_config's quantization in it (a second one written there refused); a quantized
    base's other weights load in bf16 unless `dtype` says otherwise."""
    if quantization is not None:
        if kwargs.get("quantization_config") is not None:
            raise LeapError(
                "the base model's quantization is set twice: by peft_config (quantization, or extends: DEFAULT_QLORA) "
                "and by training_config.model_init_kwargs.quantization_config",
                where=where,
                fix="keep one: peft_config's short name (nf4, fp4, int8) or the full quantization_config",
            )
        kwargs = {**kwargs, "quantization_config": quantization}
    if not is_quantized(kwargs):
        return kwargs
    config = dict(kwargs["quantization_config"])
    if vision and config.get("llm_int8_skip_modules") is None:
        config["llm_int8_skip_modules"] = list(VISION_SKIPS)
    return {"dtype": "bfloat16", **kwargs, "quantization_config": config}


def check_quantized_run(training: dict, training_type: str, user_keys, where: str) -> None:
    """What a quantized base cannot do here, said before a model loads. GRPO's rollouts move to leap-finetune's own
    sampler unless the user asked for vLLM (then: refused)."""
    if not is_quantized(training.get("model_init_kwargs")):
        return
    from leap_finetune.methods import method_of

    if method_of(training_type).encoder_class is not None:
        raise LeapError(
            f"QLoRA (a quantized base) applies to the chat-model types; {training_type} trains a sentence encoder",
            where=where,
            fix="remove peft_config.quantization (and any model_init_kwargs.quantization_config): LoRA or a full "
            "fine-tune of an encoder fits small GPUs already",
        )
    if training.get("use_vllm") and "use_vllm" not in user_keys:
        training["use_vllm"] = False  # (DEFAULT_GRPO's vLLM cannot take a 4-bit base: the config table says so)
    if training.get("use_vllm"):
        raise LeapError(
            "use_vllm with a quantized base: vLLM would be sent the 4-bit weights with the adapter merged into them, "
            "which it cannot load",
            where=where,
            fix="set use_vllm: false (leap-finetune's own sampler generates with the quantized base and its adapter), "
            "or train plain LoRA",
        )


def is_quantized(init_kwargs: dict | None) -> bool:
    config = (init_kwargs or {}).get("quantization_config") or {}
    return bool(isinstance(config, dict) and (config.get("load_in_4bit") or config.get("load_in_8bit")))


def quantization_name(init_kwargs: dict | None) -> str | None:
    """nf4 / fp4 / int8, as reports and the model card say it (None: not quantized)."""
    config = (init_kwargs or {}).get("quantization_config") or {}
    if not isinstance(config, dict):
        return None
    if config.get("load_in_8bit"):
        return "int8"
    if config.get("load_in_4bit"):
        return str(config.get("bnb_4bit_quant_type", "fp4"))
    return config.get("quant_method")


def bitsandbytes_config(config: dict):
    """transformers' BitsAndBytesConfig from the checked mapping (dtype names as torch dtypes)."""
    import torch
    from transformers import BitsAndBytesConfig

    values = {k: v for k, v in config.items() if k != "quant_method"}
    for key in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
        if isinstance(values.get(key), str):
            values[key] = getattr(torch, values[key].removeprefix("torch."))
    return BitsAndBytesConfig(**values)


def lora_name(training: dict) -> str:
    """ "LoRA", or "QLoRA (nf4)" over a quantized base: what reports, plan and the model card call the fine-tune."""
    name = quantization_name(training.get("model_init_kwargs"))
    return f"QLoRA ({name})" if name else "LoRA"
