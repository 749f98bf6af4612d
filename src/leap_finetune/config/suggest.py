"""'Did you mean' suggestions for misspelled keys and values."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from leap_finetune.methods import METHODS


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    choices = list(dict.fromkeys(choices))
    same = [c for c in choices if c.lower() == word.lower() and c != word]
    if same:  # `BF16_KAHAN` -> `bf16_kahan`
        return f"did you mean '{same[0]}'?"
    longer = [c for c in choices if c.startswith(word) and c != word]
    if len(word) >= 3 and longer:  # `adamw` -> `adamw_torch` (the first, in the library's own order)
        return f"did you mean '{longer[0]}'?"
    choices = sorted(choices)
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else ""


def check_choice(key: str, value, choices: dict[str, str], where: str, fix_tail: str = "") -> None:
    """training_config.`key` must be one of `choices` (name -> meaning): otherwise an error naming the value in YAML
    spelling, a 'did you mean' where one is close, and every choice with its meaning."""
    if isinstance(value, str) and value in choices:
        return
    from leap_finetune.config.numbers import shown
    from leap_finetune.errors import LeapError

    hint = did_you_mean(value, choices) if isinstance(value, str) else ""
    raise LeapError(
        f"training_config.{key} is {shown(value)}",
        where=where,
        fix=(hint + " " if hint else "")
        + "expected one of: "
        + "; ".join(f"{name} ({meaning})" for name, meaning in choices.items())
        + fix_tail,
    )


def unknown_key_fix(key: str, choices: Iterable[str]) -> str:
    hint = did_you_mean(key, choices)
    return hint or "remove it, or check the spelling against the config reference (docs/config.md)"


# A training_config key of other training types, and what this training type uses instead ((key, type) -> text)
INSTEAD = {
    **{
        ("max_length", name): "remove it: GRPO keeps each prompt whole and limits the generated tokens with "
        "max_completion_length (with vLLM, vllm_max_model_length is the context: prompt + completion)"
        for name, method in METHODS.items()
        if method.rewards
    },
    **{
        ("max_length", name): "set the lengths per side: retrieval.query_max_length and retrieval.document_max_length"
        for name, method in METHODS.items()
        if method.retrieval
    },
    **{
        ("max_completion_length", name): "use max_length instead (prompt and completion tokens together)"
        for name, method in METHODS.items()
        if method.cut_by_max_length
    },
    # (transformers 5 folded warmup_ratio into warmup_steps; sentence-transformers' arguments still have it)
    **{
        ("warmup_ratio", name): "use warmup_steps: a number below 1 is a fraction of the training steps "
        "(warmup_steps: 0.1 warms up over the first 10%), a whole number is steps"
        for name, method in METHODS.items()
        if not method.retrieval
    },
}


def other_type_key(key: str, training_type: str, owners: list[str]) -> tuple[str, str]:
    """(message, fix) for a training_config key that other training types have and this one has not: said as
    such, with what this type uses instead - a near spelling of this type's keys would mislead (`max_length` in
    a GRPO config is not a typo of `vllm_max_model_length`)."""
    listed = ", ".join(owners[:-1]) + f" and {owners[-1]}" if len(owners) > 1 else owners[0]
    message = f"training_config.{key} is a key of {listed} training, not of {training_type}"
    return message, INSTEAD.get((key, training_type), f"remove it ({training_type} has no such setting)")


def yaml_read_as(got) -> str | None:
    """What YAML made of a value written for a text key, in words; None for a value that is not one of YAML's traps."""
    import datetime

    if isinstance(got, bool):
        return f"the boolean {str(got).lower()} (yes, no, on, off, true and false are booleans in YAML)"
    if isinstance(got, int | float):
        # (the YAML text is gone by now: whether colons were written cannot be told, so the trap is said as an if)
        return f"the number {got!r}; if you wrote it with colons, YAML read it as a base-60 number: 12:00:00 is 43200"
    if isinstance(got, datetime.date | datetime.datetime):
        return f"a date ({got.isoformat()})"
    return None
