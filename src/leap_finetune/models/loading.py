"""Loading the tokenizer and the model a resolved config names.

`init_kwargs` is the config's checked `model_init_kwargs` (config/model_init.py): all of it goes to
the model's `from_pretrained`, and the keys that say where files come from (revision,
trust_remote_code, ...) to the tokenizer's too.
"""

from __future__ import annotations

import os
from pathlib import Path

from leap_finetune.errors import LeapError
from leap_finetune.models.lfm2_keys import add_original_lfm2_keys, load_published_vision_names
from leap_finetune.models.tiny import TINY_MODELS, build_tiny_model, load_tiny_tokenizer


def load_tokenizer(model_id: str, init_kwargs: dict | None = None):
    """The model's tokenizer; an LFM one with the response template that lets `transformers serve` return its tool
    calls as OpenAI tool_calls (models/response_template.py), saved with everything trained from it."""
    from leap_finetune.models.response_template import add_response_template

    tokenizer = _load_tokenizer(model_id, init_kwargs)
    add_response_template(tokenizer)
    return tokenizer


def _load_tokenizer(model_id: str, init_kwargs: dict | None = None):
    if model_id in TINY_MODELS:
        return load_tiny_tokenizer(model_id)
    from transformers import AutoTokenizer

    from leap_finetune.config.model_init import TOKENIZER_KEYS
    from leap_finetune.models.hub import download_kwargs

    kwargs = {**download_kwargs(model_id), **{k: v for k, v in (init_kwargs or {}).items() if k in TOKENIZER_KEYS}}
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id, **kwargs)
    except Exception as err:  # noqa: BLE001
        raise _unavailable(model_id, "tokenizer", err) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tokenizer_at_hand(model_id: str, init_kwargs: dict | None = None):
    """(the tokenizer, "") when its files are here - built in, a folder, the Hugging Face cache - else (None, why):
    never downloaded (`plan` works on any machine and needs the tokenizer only to count tokens)."""
    from leap_finetune.models.hub import is_hub_id

    if is_hub_id(model_id):
        try:
            return load_tokenizer(model_id, {**(init_kwargs or {}), "local_files_only": True}), ""
        except LeapError:
            return None, f"the tokenizer of {model_id} is not in the Hugging Face cache"
    if not os.path.exists(model_id) and model_id not in TINY_MODELS:
        return None, f"the model folder {model_id} is not on this machine"
    return load_tokenizer(model_id, init_kwargs), ""  # (a broken folder is the user's to fix: its error)


def end_token_ids(tokenizer) -> list[int]:
    """The ids that end an assistant turn: the tokenizer's end token and, where the vocabulary has it, <|im_end|>."""
    ids = {tokenizer.eos_token_id}
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end_of_turn, int) and end_of_turn != tokenizer.unk_token_id:
        ids.add(end_of_turn)
    return sorted(i for i in ids if i is not None)


def torch_dtype(name):
    """A dtype name from model_init_kwargs ("bfloat16", "auto", ...) as from_pretrained takes it."""
    import torch

    return name if name == "auto" or not isinstance(name, str) else getattr(torch, name)


def load_model(model_id: str, tokenizer, init_kwargs: dict | None = None, *, dtype=None):
    """`dtype` is the default when init_kwargs has none (float32 master weights for training). A vision-language
    model's encoder runs over its pictures' real patches only (models/vision.py real_patches_only)."""
    from leap_finetune.models.vision import real_patches_only

    model = _load_model(model_id, tokenizer, init_kwargs, dtype=dtype)
    real_patches_only(model)
    return model


def _load_model(model_id: str, tokenizer, init_kwargs: dict | None = None, *, dtype=None):
    from leap_finetune.startup import import_quickly

    import_quickly("transformers.modeling_utils")  # (torch and transformers' model classes, quickly: startup.py)
    import torch

    kwargs = dict(init_kwargs or {})
    dtype = torch_dtype(kwargs.pop("dtype", dtype if dtype is not None else torch.float32))
    if kwargs.get("quantization_config") is not None:
        kwargs.update(quantized_loading(kwargs.pop("quantization_config")))
        if model_id in TINY_MODELS:
            return _tiny_quantized(model_id, tokenizer, kwargs, dtype)
    if model_id in TINY_MODELS:
        model = build_tiny_model(model_id, tokenizer, dtype=None if dtype == "auto" else dtype)
        if kwargs.get("attn_implementation"):
            model.set_attn_implementation(kwargs["attn_implementation"])
        return model
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from leap_finetune.models.hub import download_kwargs
    from leap_finetune.models.vision import is_vision_model

    kwargs = {**download_kwargs(model_id), **kwargs}
    auto = AutoModelForImageTextToText if is_vision_model(model_id) else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(model_id, dtype=dtype, **kwargs)
    except Exception as err:  # noqa: BLE001
        raise _unavailable(model_id, "model", err, kwargs.get("subfolder")) from None
    add_original_lfm2_keys(model.config)  # (what it saves loads in vLLM too)
    load_published_vision_names(model)  # (a resumed checkpoint's vision tower)
    return model


def quantized_loading(config: dict) -> dict:
    """QLoRA's base: from_pretrained's arguments that quantize its linear layers with bitsandbytes as they load,
    straight onto this process's device (a bitsandbytes model cannot be moved afterwards: the trainer leaves it where
    it loaded)."""
    import torch

    from leap_finetune.config.quantization import bitsandbytes_config

    kwargs = {"quantization_config": bitsandbytes_config(config) if "quant_method" not in config else config}
    if torch.cuda.is_available():
        from accelerate import PartialState

        kwargs["device_map"] = {"": PartialState().device}  # (this process's GPU, as the trainer will use it)
    return kwargs


def _tiny_quantized(model_id: str, tokenizer, kwargs: dict, dtype):
    """A built-in tiny model, built, saved and loaded back quantized (the way a downloaded one loads)."""
    import tempfile

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from leap_finetune.models.tiny import TINY_VISION_MODELS

    auto = AutoModelForImageTextToText if model_id in TINY_VISION_MODELS else AutoModelForCausalLM
    with tempfile.TemporaryDirectory(prefix="leap-tiny-") as folder:
        build_tiny_model(model_id, tokenizer).save_pretrained(folder)
        model = auto.from_pretrained(folder, dtype=dtype, **kwargs)
    model.config.name_or_path = model_id
    model.name_or_path = ""  # (as a built tiny model has: no temporary folder recorded as the adapter's base)
    return model


# What a model folder needs, as transformers looks for it: (what, any one of these files)
FOLDER_FILES = {
    "tokenizer": (("tokenizer files", ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")),),
    "model": (
        ("config.json", ("config.json",)),
        (
            "weights",
            ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json"),
        ),
    ),
}


def missing_folder(model_id: str) -> LeapError | None:
    """The error for a model folder that is not there (yet: another config's run may make it), else None."""
    if os.path.isabs(model_id) and not os.path.exists(model_id):
        return LeapError(
            f"model_name: the folder {model_id} does not exist",
            where=model_id,
            fix="check model_name (a relative path starts at the config file's folder); a model another "
            "config trains exists only once that run finished",
        )
    return None


def _unavailable(model_id: str, what: str, err: Exception, subfolder: str | None = None) -> LeapError:
    said = " ".join(str(err).split()) or type(err).__name__  # (transformers' messages run over several lines)
    said = said if len(said) <= 300 else said[:297] + "..."
    missing = missing_folder(model_id)
    if missing is not None:
        return missing
    if os.path.isdir(model_id):
        return _folder_error(Path(model_id) / (subfolder or ""), what, said)
    from leap_finetune.models.hub import hub_unreachable, is_hub_id

    unreachable = hub_unreachable() if is_hub_id(model_id) else None
    fix = (
        "check the model id and your network; offline, download it once with `hf download "
        f"{model_id}` where the Hub is reachable, or point model_name at a local folder "
        f"(built-in offline models: {', '.join(TINY_MODELS)})"
    )
    if unreachable is not None and _not_in_cache(err):  # (its files were looked for in the cache only)
        return LeapError(
            f"cannot load the {what} '{model_id}': it is not in the Hugging Face cache, and the Hub "
            f"cannot be used ({unreachable})",
            where="model_name",
            fix=fix,
        )
    return LeapError(f"cannot load the {what} '{model_id}': {said}", where="model_name", fix=fix)


def _not_in_cache(err: Exception) -> bool:
    """A file was looked for in the cache only and is not there (other errors - a model that needs
    trust_remote_code, a damaged file - are said as they are)."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    seen, current = set(), err
    while current is not None and id(current) not in seen:  # transformers wraps it in an OSError
        if isinstance(current, LocalEntryNotFoundError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    text = str(err)
    return "local_files_only" in text or "offline mode" in text or "outgoing traffic has been disabled" in text


def _folder_error(folder: Path, what: str, said: str) -> LeapError:
    """What the folder lacks, by name (transformers' own message lists its internal fallbacks, over lines)."""
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    present = [p.name + ("/" if p.is_dir() else "") for p in entries]
    holds = (
        "it is empty"
        if not present
        else "it holds " + ", ".join(present[:8]) + (f" and {len(present) - 8} more" if len(present) > 8 else "")
    )
    missing = [
        f"{label} ({', '.join(names)})" if len(names) > 1 else label
        for label, names in FOLDER_FILES[what]
        if not any((folder / name).exists() for name in names)
    ]
    nested = [p.name for p in entries if (p / "config.json").is_file()]
    if what == "model" and nested and not (folder / "config.json").exists():
        fix = (
            f"the model is in the sub-folder {nested[0]}/: set training_config.model_init_kwargs: "
            f"{{subfolder: {nested[0]}}}, or point model_name at that folder"
        )
    else:
        fix = (
            "set model_name to a complete model folder (a finished run's model/ folder, or `hf download MODEL "
            "--local-dir FOLDER`)"
            + (", or copy the base model's tokenizer files into it" if what == "tokenizer" else "")
        )
    if missing:
        return LeapError(
            f"cannot load the {what} from the folder: it has no {' and no '.join(missing)}; {holds}",
            where=str(folder),
            fix=fix,
        )
    return LeapError(f"cannot load the {what} from the folder ({holds}): {said}", where=str(folder), fix=fix)
