"""`training_config.model_init_kwargs`: what is passed to `from_pretrained` when the model loads.

Every key is either forwarded (to the model, and where it matters to the tokenizer too: a
tokenizer from another revision than its model is a silent bug) or refused with the reason; none
is dropped. `dtype` takes the names people write (`bf16`, `fp16`, `float32`, `auto`).
"""

from __future__ import annotations

from leap_finetune.config.suggest import did_you_mean
from leap_finetune.errors import LeapError

DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "auto": "auto",
}
# Forwarded to from_pretrained as given (besides dtype, handled above).
FORWARDED = (
    "attn_implementation",
    "revision",
    "trust_remote_code",
    "quantization_config",
    "cache_dir",
    "local_files_only",
    "token",
    "subfolder",
    "use_safetensors",
    "variant",
    "low_cpu_mem_usage",
    "use_kernels",
    "force_download",
    "key_mapping",
    "experts_implementation",
)
# Also given to the tokenizer, so that model and tokenizer come from the same place.
TOKENIZER_KEYS = ("revision", "trust_remote_code", "cache_dir", "local_files_only", "token", "force_download")
REFUSED = {
    "device_map": "the trainer places the model on each process's device; a device_map would fight it",
    "max_memory": "the trainer places the model on each process's device (no offloading while training)",
    "offload_folder": "the trainer places the model on each process's device (no offloading while training)",
    "tp_plan": "tensor parallelism is not supported for training here",
    "tp_size": "tensor parallelism is not supported for training here",
    "device_mesh": "tensor parallelism is not supported for training here",
    "config": "the model's own config.json is used",
    "pretrained_model_name_or_path": "set the top-level model_name",
    "output_loading_info": "not a loading option",
    "state_dict": "load weights from a folder: point model_name at it",
}
# the built-in tiny models are built, not downloaded (a quantized one is built, saved and loaded quantized)
TINY_KEYS = ("dtype", "attn_implementation", "quantization_config")


def check_model_init_kwargs(
    value, *, tiny: bool, training_type: str, peft: bool, where: str, quantization: dict | None = None
) -> dict:
    """The normalised kwargs (dtype canonical), or a LeapError naming the key. `quantization`: peft_config's (QLoRA),
    checked here as a quantization_config written by hand is."""
    if quantization is not None:
        _check_quantization(quantization, peft=peft, where=where, here="peft_config.quantization")
    if value is None:
        return {}
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, dict):
        raise LeapError(
            "training_config.model_init_kwargs must be a mapping of from_pretrained arguments",
            where=where,
            fix="e.g. model_init_kwargs: {dtype: bfloat16, attn_implementation: sdpa}",
        )
    kwargs = dict(value)
    if "torch_dtype" in kwargs:  # transformers 5 renamed it; both spellings are common in configs
        if "dtype" in kwargs and kwargs["dtype"] != kwargs["torch_dtype"]:
            raise LeapError(
                "training_config.model_init_kwargs sets both dtype and torch_dtype",
                where=where,
                fix="keep dtype (torch_dtype is its old name)",
            )
        kwargs["dtype"] = kwargs.pop("torch_dtype")
    for key in kwargs:
        here = f"training_config.model_init_kwargs.{key}"
        if key in REFUSED:
            raise LeapError(f"{here} is not supported", where=where, fix=f"remove it: {REFUSED[key]}")
        if key != "dtype" and key not in FORWARDED:
            hint = did_you_mean(str(key), ("dtype", "torch_dtype", *FORWARDED))
            raise LeapError(
                f"{here}: '{key}' is not a from_pretrained argument leap-finetune forwards",
                where=where,
                fix=(hint + " " if hint else "") + "forwarded: dtype (or torch_dtype), " + ", ".join(FORWARDED),
            )
        if tiny and key not in TINY_KEYS:
            raise LeapError(
                f"{here} does not apply to the built-in tiny models (they are built, not downloaded)",
                where=where,
                fix=f"remove it, or use a real model; tiny models take {' and '.join(TINY_KEYS)}",
            )
    if "dtype" in kwargs:
        kwargs["dtype"] = _dtype(kwargs["dtype"], where)
    if "attn_implementation" in kwargs:
        _check_attention(kwargs["attn_implementation"], where)
    if kwargs.get("quantization_config") is not None:
        _check_quantization(kwargs["quantization_config"], peft=peft, where=where)
    return kwargs


# attention implementations that need a package of their own (import name, pip name)
ATTENTION_PACKAGES = {
    "flash_attention_2": ("flash_attn", "flash-attn"),
    "flash_attention_3": ("flash_attn_interface", "flash-attn 3 (built from its hopper/ folder)"),
    "flash_attention_4": ("flash_attn.cute", "flash-attn 4"),
}


def _check_attention(name, where: str) -> None:
    """A name transformers knows (or a Hub kernel, `org/repo`), with its package installed."""
    import importlib.util

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    here = "training_config.model_init_kwargs.attn_implementation"
    known = [
        "eager",
        "sdpa",
        *[k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if "|" not in k and k != "sdpa"],
        "leap_varlen",
    ]
    if not isinstance(name, str) or not (name in known or "/" in name):
        hint = did_you_mean(str(name), known)
        raise LeapError(
            f"{here} is {name!r}",
            where=where,
            fix=(hint + " " if hint else "") + "expected one of " + ", ".join(known) + " (or a Hub kernel, org/repo)",
        )
    if name in ATTENTION_PACKAGES:
        module, package = ATTENTION_PACKAGES[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise LeapError(
                f"{here} is {name}, which needs {package}; it is not installed here",
                where=where,
                fix=f"install {package} (CUDA GPUs only), or use sdpa (on a CUDA GPU leap-finetune "
                "already uses varlen flash attention for LFM2, see docs/speed.md)",
            )


def _dtype(value, where: str) -> str:
    name = str(value).removeprefix("torch.")
    if name in DTYPES:
        return DTYPES[name]
    hint = did_you_mean(name, DTYPES)
    raise LeapError(
        f"training_config.model_init_kwargs.dtype is {value!r}",
        where=where,
        fix=(hint + " " if hint else "") + "expected bfloat16 (bf16), float16 (fp16), float32 (fp32) or auto",
    )


def _check_quantization(
    config, *, peft: bool, where: str, here: str = "training_config.model_init_kwargs.quantization_config"
) -> None:
    """A quantized model trains only through LoRA, and its library must be installed."""
    import importlib.util

    if not isinstance(config, dict):
        raise LeapError(
            f"{here} must be a mapping",
            where=where,
            fix="e.g. quantization_config: {load_in_4bit: true, bnb_4bit_quant_type: nf4}",
        )
    config = dict(config)
    if "quant_method" not in config and (config.get("load_in_4bit") or config.get("load_in_8bit")):
        config["quant_method"] = "bitsandbytes"
    try:
        from transformers.quantizers.auto import AutoQuantizationConfig

        from leap_finetune.quiet import quiet_bitsandbytes

        quiet_bitsandbytes()
        AutoQuantizationConfig.from_dict(config)
    except (ValueError, TypeError, KeyError) as err:
        raise LeapError(
            f"{here} is not a quantization config transformers accepts: {err}",
            where=where,
            fix="see transformers' quantization documentation (e.g. BitsAndBytesConfig)",
        ) from None
    if not peft:
        raise LeapError(
            f"{here} is set for a full fine-tune: the weights of a quantized model cannot be trained",
            where=where,
            fix="add a peft_config (QLoRA: LoRA adapters over the quantized model)",
        )
    package = {"bitsandbytes": "bitsandbytes"}.get(str(config["quant_method"]), None)
    if package and importlib.util.find_spec(package) is None:
        raise LeapError(
            f"{here} needs {package}, which is not installed here",
            where=where,
            fix=f"pip install 'leap-finetune[qlora]' (or: pip install {package}); bitsandbytes trains 4-bit bases on "
            "CUDA GPUs and, slowly, on CPUs",
        )
