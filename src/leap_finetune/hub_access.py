"""Whether the Hugging Face Hub answers right now: asked once per process with a short timeout, so that a machine
without a network fails in seconds with one clear line instead of a minute of the libraries' retries (measured: 60-90
s for a tokenizer, ~50 s and ten "Retrying in 8s" lines for a Hub dataset). Used by models/ (from_pretrained reads
the cache at once) and data/ (a Hub dataset that cannot come is an error at once).
"""

from __future__ import annotations

import os
import time

PROBE_TIMEOUT_S = 5.0
_probed: dict[str, str | None] = {}  # endpoint -> why it cannot be reached (None: it answered)


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
