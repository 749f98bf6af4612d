"""Scoring a generated assistant turn's tool calls against the reference turn's (the `tool_call` metric, and GRPO's
`tool_call_match` reward): the generated calls are parsed with the training data's parser (data/tool_calls.py:
LFM bracket notation, `[name(key=value)]`, or the JSON form `[{"name": ..., "arguments": {...}}]` between the same
markers), then compared as values - `1` equals `1.0`, a dict's key order is free, a bool is not a number.

Per row:
    parsed        1 when the turn's tool-call blocks parse (a turn without any parses), else 0
    name          function names right: position by position (`order: ordered`) or as a multiset (`set`), over the
                  longer of the two lists (an extra call costs as a missing one)
    exact         every call right, name and arguments, and no call more or less
    argument_f1   F1 of the (call, argument, value) triples
    no_call       rows whose reference makes no call: 1 when the model made none either
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from leap_finetune.data import tool_calls as tc

ORDERS = ("set", "ordered")


@dataclass(frozen=True)
class CallScore:
    parsed: float
    exact: float
    name: float | None = None  # (rows that expect calls)
    argument_f1: float | None = None
    no_call: float | None = None  # (rows that expect none)
    problem: str | None = None  # why the calls did not parse


def parse_turn(text: str) -> tuple[list[tc.ToolCall], str | None]:
    """The tool calls of a generated turn and, when they do not parse, why (the calls before the problem kept)."""
    blocks = tc.find_tool_calls(text)
    if blocks.problem is None:
        foreign = None if blocks.calls else tc.foreign_format(text)
        return blocks.calls, (f"a {foreign} call, not LFM's tool-call notation" if foreign else None)
    json_calls = _json_form(text)
    if json_calls is not None:
        return json_calls, None
    return blocks.calls, blocks.problem


def _json_form(text: str) -> list[tc.ToolCall] | None:
    """`<|tool_call_start|>[{"name": ..., "arguments": {...}}]<|tool_call_end|>` (LFM2's JSON output, asked for
    in the system prompt), every block of the turn; None when a block is not that form."""
    calls: list[tc.ToolCall] = []
    position = 0
    while (start := text.find(tc.CALL_START, position)) != -1:
        end = text.find(tc.CALL_END, start)
        if end == -1:
            return None
        try:
            value = json.loads(text[start + len(tc.CALL_START) : end])
        except json.JSONDecodeError:
            return None
        for item in value if isinstance(value, list) else [value]:
            arguments = item.get("arguments", item.get("parameters", {})) if isinstance(item, dict) else None
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    return None
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(arguments, dict):
                return None
            calls.append(tc.ToolCall(item["name"], arguments))
        position = end + len(tc.CALL_END)
    return calls if calls else None


def canonical(value: Any) -> Any:
    """A hashable form in which equal values are equal: numbers as floats (1 == 1.0; a bool stays a bool), dicts
    key-order free, lists in order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, (int, float)):
        return ("number", float(value))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(canonical(v) for v in value))
    if isinstance(value, dict):
        return ("dict", frozenset((str(k), canonical(v)) for k, v in value.items()))
    return ("other", repr(value))


def _call_key(call: tc.ToolCall):
    return call.name, frozenset((k, canonical(v)) for k, v in call.arguments.items())


def score_turn(generated: str, reference: list[tc.ToolCall], *, order: str = "set") -> CallScore:
    """`generated`: the model's assistant turn (text); `reference`: the calls the reference turn makes ([] for a
    turn that should answer without calling)."""
    calls, problem = parse_turn(generated)
    return score_calls(calls, problem, reference, order=order)


def served_calls(calls: list[tuple[str, str]] | None) -> tuple[list[tc.ToolCall], str | None]:
    """The tool calls an OpenAI-compatible server returned ([(name, arguments as JSON text)]) as ToolCalls, and why
    they are not read when an argument string is not a JSON object."""
    found = []
    for name, arguments in calls or []:
        try:
            value = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as err:
            return found, f"the arguments of {name} are not JSON ({err.msg})"
        if not isinstance(value, dict):
            return found, f"the arguments of {name} are not a JSON object"
        found.append(tc.ToolCall(name, value))
    return found, None


def calls_in_text(content: str) -> bool:
    """Whether a served answer's text holds tool calls its server did not return as tool_calls: LFM notation with the
    markers, or without them (a server that removes special tokens from the text leaves `[name(key=value)]`)."""
    if tc.CALL_START in content:
        return True
    for start in (m.start() for m in _CALL_LIST.finditer(content)):  # a `[name(` anywhere, text around it or not
        for end in range(len(content), start, -1):
            if content[end - 1] == "]":
                try:
                    if tc.parse_calls(content[start:end]):
                        return True
                except tc.ToolCallSyntaxError:
                    continue
    return False


_CALL_LIST = re.compile(r"\[\s*[A-Za-z_][\w.]*\(")


def reference_calls(solution: str) -> tuple[list[tc.ToolCall] | None, str | None]:
    """A reference turn's calls (a GRPO `solution`): LFM notation, or structured calls as JSON text (what a family
    that keeps OpenAI's tool_calls gives as its solution); [] for a turn that calls nothing. (None, why) when it holds
    calls that do not parse, or another family's call format."""
    blocks = tc.find_tool_calls(solution)
    if blocks.problem is not None:
        return None, blocks.problem
    if blocks.calls:
        return blocks.calls, None
    text = solution.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            found = []
            for item in value:
                function = item.get("function", item)
                arguments = function.get("arguments", function.get("parameters", {}))
                calls, problem = served_calls([(function.get("name"), arguments)])
                if problem or not isinstance(function.get("name"), str):
                    return None, problem or "a structured call without a name"
                found += calls
            return found, None
    foreign = tc.foreign_format(solution)
    if foreign:
        return None, f"a {foreign} call, not LFM's tool-call notation"
    return [], None


def score_calls(
    calls: list[tc.ToolCall], problem: str | None, reference: list[tc.ToolCall], *, order: str = "set"
) -> CallScore:
    """Calls already read (from a turn's text, or a server's tool_calls) against the reference calls."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    parsed = 0.0 if problem else 1.0
    if not reference:
        made_none = not calls and problem is None
        return CallScore(parsed, exact=float(made_none), no_call=float(made_none), problem=problem)
    longest = max(len(calls), len(reference))
    if order == "ordered":
        names = sum(a.name == b.name for a, b in zip(calls, reference)) / longest
        exact = float(problem is None and [_call_key(c) for c in calls] == [_call_key(c) for c in reference])
        got = Counter((i, c.name, k, canonical(v)) for i, c in enumerate(calls) for k, v in c.arguments.items())
        want = Counter((i, c.name, k, canonical(v)) for i, c in enumerate(reference) for k, v in c.arguments.items())
    else:
        names = sum((Counter(c.name for c in calls) & Counter(c.name for c in reference)).values()) / longest
        exact = float(problem is None and Counter(map(_call_key, calls)) == Counter(map(_call_key, reference)))
        got = Counter((c.name, k, canonical(v)) for c in calls for k, v in c.arguments.items())
        want = Counter((c.name, k, canonical(v)) for c in reference for k, v in c.arguments.items())
    return CallScore(parsed, exact, name=names, argument_f1=_f1(got, want, names), problem=problem)


def _f1(got: Counter, want: Counter, names: float) -> float:
    if not got and not want:  # calls without arguments: the arguments are right when the names are
        return names
    hits = sum((got & want).values())
    if not hits:
        return 0.0
    precision, recall = hits / sum(got.values()), hits / sum(want.values())
    return 2 * precision * recall / (precision + recall)


def aggregate(scores: list[CallScore]) -> dict[str, float]:
    """The benchmark's sub-scores: each the mean over the rows it applies to (exact: over every row - a no-call row
    is exact when no call was made; that is the benchmark's score)."""

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    found = {
        "exact": mean(s.exact for s in scores),
        "parsed": mean(s.parsed for s in scores),
        "name": mean(s.name for s in scores),
        "argument_f1": mean(s.argument_f1 for s in scores),
        "no_call": mean(s.no_call for s in scores),
    }
    return {key: value for key, value in found.items() if value is not None}
