"""A row's answer as the answer-matching rewards and checks read it (rl/rewards.py accuracy; the data step's check
of GRPO solutions): the final answer (a \\boxed{} value, else the text), lower case, punctuation ignored. Here, below
both, so that the data step can refuse a solution the reward could not use without importing the rewards."""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")


def final_answer(text: str) -> str:
    """What an answer says in the end: a \\boxed{...} value, else the text itself."""
    boxed = _BOXED.findall(text)
    return boxed[-1] if boxed else text


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w.\-/]+", " ", text.casefold()).split()).strip(" .")


def nothing_to_match(solution: str) -> str | None:
    """Why the accuracy reward cannot use a solution: nothing is left of it once normalised ("...", "?!"), so an
    empty answer would match it and earn the reward. None for a solution it can use."""
    if normalise(final_answer(str(solution))) or not str(solution).strip():
        return None  # (a blank solution is no solution: the reward gives the row None, as for a missing one)
    return (
        f"{str(solution)!r} is nothing once the accuracy reward normalises it (lower case, punctuation dropped): an "
        "empty answer would match it and be rewarded; write the answer itself (text, a number, or a \\boxed{} value)"
    )
