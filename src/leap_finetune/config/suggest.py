"""'Did you mean' suggestions for misspelled keys and values."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    choices = list(dict.fromkeys(choices))
    longer = [c for c in choices if c.startswith(word) and c != word]
    if len(word) >= 3 and longer:  # `adamw` -> `adamw_torch` (the first, in the library's own order)
        return f"did you mean '{longer[0]}'?"
    choices = sorted(choices)
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else ""


def unknown_key_fix(key: str, choices: Iterable[str]) -> str:
    hint = did_you_mean(key, choices)
    return hint or "remove it, or check the spelling against the config reference (docs/config.md)"
