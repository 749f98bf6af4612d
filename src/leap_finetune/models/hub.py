"""Whether a model's files can come from the Hugging Face Hub right now.

Without a network, transformers asks the Hub again and again before it looks in its cache: measured 60-90 s of
retries for a tokenizer with HF_HUB_OFFLINE unset (users rarely set it). The Hub is asked once, with a short
timeout; when it does not answer, files are read from the cache at once (`local_files_only`), and a model that
is not there is an error that says so in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from leap_finetune.hub_access import hub_unreachable, offline_by_setting  # noqa: F401 (used by models/)


def is_hub_id(model_id: str) -> bool:
    """A name the Hub resolves: not a built-in tiny model, not a path."""
    from leap_finetune.models.tiny import TINY_MODELS

    return model_id not in TINY_MODELS and not os.path.isabs(model_id) and not Path(model_id).exists()


def download_kwargs(model_id: str) -> dict:
    """from_pretrained's `local_files_only=True` for a Hub id while the Hub cannot be reached (read the cache at
    once instead of retrying); {} otherwise."""
    if is_hub_id(model_id) and hub_unreachable() is not None:
        return {"local_files_only": True}
    return {}
