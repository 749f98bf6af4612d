"""Loading the tokenizer and the model a resolved config names.

`init_kwargs` is the config's checked `model_init_kwargs` (config/model_init.py): all of it goes to
the model's `from_pretrained`, and the keys that say where files come from (revision,
trust_remote_code, ...) to the tokenizer's too.
"""

from __future__ import annotations

import os

from leap_finetune.errors import LeapError
from leap_finetune.models.tiny import TINY_MODELS, build_tiny_model, load_tiny_tokenizer


def load_tokenizer(model_id: str, init_kwargs: dict | None = None):
    if model_id in TINY_MODELS:
        return load_tiny_tokenizer(model_id)
    from transformers import AutoTokenizer

    from leap_finetune.config.model_init import TOKENIZER_KEYS

    kwargs = {k: v for k, v in (init_kwargs or {}).items() if k in TOKENIZER_KEYS}
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id, **kwargs)
    except Exception as err:  # noqa: BLE001
        raise _unavailable(model_id, "tokenizer", err) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def torch_dtype(name):
    """A dtype name from model_init_kwargs ("bfloat16", "auto", ...) as from_pretrained takes it."""
    import torch

    return name if name == "auto" or not isinstance(name, str) else getattr(torch, name)


def load_model(model_id: str, tokenizer, init_kwargs: dict | None = None, *, dtype=None):
    """`dtype` is the default when init_kwargs has none (float32 master weights for training)."""
    import torch

    kwargs = dict(init_kwargs or {})
    dtype = torch_dtype(kwargs.pop("dtype", dtype if dtype is not None else torch.float32))
    if model_id in TINY_MODELS:
        model = build_tiny_model(model_id, tokenizer, dtype=None if dtype == "auto" else dtype)
        if kwargs.get("attn_implementation"):
            model.set_attn_implementation(kwargs["attn_implementation"])
        return model
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from leap_finetune.models.vision import is_vision_model

    auto = AutoModelForImageTextToText if is_vision_model(model_id) else AutoModelForCausalLM
    try:
        return auto.from_pretrained(model_id, dtype=dtype, **kwargs)
    except Exception as err:  # noqa: BLE001
        raise _unavailable(model_id, "model", err) from None


def _unavailable(model_id: str, what: str, err: Exception) -> LeapError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if os.path.isabs(model_id) and not os.path.exists(model_id):
        return LeapError(f"model_name: the folder {model_id} does not exist", where=model_id,
                         fix="check model_name (a relative path starts at the config file's folder); a model another "
                         "config trains exists only once that run finished")
    if os.path.isabs(model_id):
        return LeapError(f"cannot load the {what} from the folder: {first_line}", where=model_id,
                         fix="the folder must hold a transformers checkpoint (config.json, weights, tokenizer files)")
    return LeapError(
        f"cannot load the {what} '{model_id}'" + (" (offline mode, and it is not in the Hugging Face cache)" if offline else "")
        + f": {first_line}",
        where="model_name",
        fix="check the model id and your network; offline, download it once with `hf download "
        f"{model_id}` where the Hub is reachable, or point model_name at a local folder "
        "(built-in offline models: tiny-lfm2, tiny-lfm2.5)",
    )
