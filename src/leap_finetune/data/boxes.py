"""Boxes in a text - `[x1, y1, x2, y2]`, a JSON list of them, or objects with a `bbox` / `box` / `bbox_2d` list - as
GRPO's grounding rewards and benchmarks read them (rl/grounding.py scores them), here below both so that the data
step can refuse a solution those rewards could not score without importing the rewards."""

from __future__ import annotations

import json
import math
import re

Box = tuple[float, float, float, float]
_NUMBER = r"-?\d+(?:\.\d+)?"
_BRACKETED = re.compile(rf"\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]")
_KEYS = ("bbox", "box", "bbox_2d", "bounding_box")


def boxes_in(text) -> list[Box]:
    """Every box of an answer, in order (none for text without one)."""
    if not isinstance(text, str) or not text.strip():
        return []
    found: list[Box] = []
    for candidate in _json_values(text):
        _collect(candidate, found)
    if found:
        return found
    return [tuple(float(v) for v in m.groups()) for m in _BRACKETED.finditer(text)]


def _json_values(text: str):
    """The JSON values that start at each `[` or `{` of the text and parse (the outermost ones)."""
    decoder = json.JSONDecoder()
    position = 0
    while True:
        starts = [i for i in (text.find("[", position), text.find("{", position)) if i >= 0]
        if not starts:
            return
        start = min(starts)
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            position = start + 1
            continue
        yield value
        position = end


def _collect(value, found: list[Box]) -> None:
    if _is_box(value):
        found.append(tuple(float(v) for v in value))
    elif isinstance(value, list):
        for item in value:
            _collect(item, found)
    elif isinstance(value, dict):
        for key in _KEYS:
            if key in value:
                _collect(value[key], found)
                return


def _is_box(value) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 4
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    )


def box_problem(text) -> str | None:
    """Why boxes cannot be scored against this reference: it holds none, or one without area (IoU against it is 0
    for every answer). None for a reference the grounding scores can use."""
    boxes = boxes_in(text)
    if not boxes:
        return f"{str(text)[:80]!r} holds no box [x1, y1, x2, y2] (four numbers: left, top, right, bottom)"
    for box in boxes:
        if box[2] <= box[0] or box[3] <= box[1]:
            shown = "[" + ", ".join(f"{v:g}" for v in box) + "]"
            return f"box {shown} has no area (x2 <= x1 or y2 <= y1): every answer would score 0 against it"
    return None
