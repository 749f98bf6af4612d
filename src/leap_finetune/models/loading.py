"""Loading the tokenizer and the model a resolved config names."""

from __future__ import annotations

import os

from leap_finetune.errors import LeapError
from leap_finetune.models.tiny import TINY_MODELS, build_tiny_model, load_tiny_tokenizer


def load_tokenizer(model_id: str):
    if model_id in TINY_MODELS:
        return load_tiny_tokenizer(model_id)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id)
    except Exception as err:  # noqa: BLE001
        raise _unavailable(model_id, "tokenizer", err) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(model_id: str, tokenizer, dtype, attn_implementation: str | None = None):
    if model_id in TINY_MODELS:
        model = build_tiny_model(model_id, tokenizer, dtype=dtype)
        if attn_implementation:
            model.set_attn_implementation(attn_implementation)
        return model
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from leap_finetune.models.vision import is_vision_model

    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    auto = AutoModelForImageTextToText if is_vision_model(model_id) else AutoModelForCausalLM
    try:
        return auto.from_pretrained(model_id, dtype=dtype, **extra)
    except Exception as err:  # noqa: BLE001
        raise _unavailable(model_id, "model", err) from None


def _unavailable(model_id: str, what: str, err: Exception) -> LeapError:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
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
