"""Whether a model's files can come from the Hugging Face Hub right now.

Without a network, transformers asks the Hub again and again before it looks in its cache: measured 60-90 s of
retries for a tokenizer with HF_HUB_OFFLINE unset (users rarely set it). The Hub is asked once, with a short
timeout; when it does not answer, files are read from the cache at once (`local_files_only`), and a model that
is not there is an error that says so in one line.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROBE_TIMEOUT_S = 5.0
_probed: dict[str, str | None] = {}  # endpoint -> why it cannot be reached (None: it answered)


def is_hub_id(model_id: str) -> bool:
    """A name the Hub resolves: not a built-in tiny model, not a path."""
    from leap_finetune.models.tiny import TINY_MODELS

    return model_id not in TINY_MODELS and not os.path.isabs(model_id) and not Path(model_id).exists()


def offline_by_setting() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on") or os.environ.get(
        "TRANSFORMERS_OFFLINE", ""
    ).lower() in ("1", "true", "yes", "on")


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_unreachable() -> str | None:
    """Why the Hub cannot be reached ("HF_HUB_OFFLINE=1", "connection refused", "no answer within 5 s"), or None
    when it answers (any HTTP status: the network works). Asked once per process and endpoint."""
    if offline_by_setting():
        return "HF_HUB_OFFLINE=1"
    url = endpoint()
    if url not in _probed:
        _probed[url] = _probe(url)
    return _probed[url]


def _probe(url: str) -> str | None:
    # huggingface_hub's own client: the same proxies and certificates as its downloads
    from huggingface_hub.utils import get_session

    started = time.monotonic()
    try:
        get_session().head(url, timeout=PROBE_TIMEOUT_S, follow_redirects=False)
    except Exception as err:  # noqa: BLE001 - any failure to get an answer means: not reachable now
        waited = time.monotonic() - started
        if waited >= PROBE_TIMEOUT_S * 0.9:
            return f"{url} gave no answer within {PROBE_TIMEOUT_S:g} s"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"{url} cannot be reached ({reason})"
    return None


def download_kwargs(model_id: str) -> dict:
    """from_pretrained's `local_files_only=True` for a Hub id while the Hub cannot be reached (read the cache at
    once instead of retrying); {} otherwise."""
    if is_hub_id(model_id) and hub_unreachable() is not None:
        return {"local_files_only": True}
    return {}
