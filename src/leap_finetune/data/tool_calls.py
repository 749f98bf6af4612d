"""LFM tool-call notation: parsing, formatting, and recognising the formats it is not.

LFM2 and LFM2.5 write a tool call in the assistant's content as a Python list of calls with
keyword arguments between two special tokens:

    <|tool_call_start|>[get_weather(location="Boston", days=3)]<|tool_call_end|>

Arguments are Python literals (strings, numbers, True/False/None, lists, dicts), so a call is
parsed with Python's own `ast` module rather than a hand-written grammar.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

CALL_START, CALL_END = "<|tool_call_start|>", "<|tool_call_end|>"
LIST_START, LIST_END = "<|tool_list_start|>", "<|tool_list_end|>"
RESPONSE_START, RESPONSE_END = "<|tool_response_start|>", "<|tool_response_end|>"

# Tool-call formats of other model families that users paste into LFM data by mistake. Trained
# as plain text they teach the model a format its runtime never parses.
FOREIGN_FORMATS = [
    (re.compile(r"<tool_call>.*?</tool_call>|<tool_call>", re.S), "Hermes/Qwen <tool_call>...</tool_call> XML"),
    (re.compile(r"\[TOOL_CALLS\]"), "Mistral [TOOL_CALLS]"),
    (re.compile(r"<function_?call>", re.I), "<function_call> tags"),
    (re.compile(r"<function=[\w.\-]+>"), "Llama <function=name> tags"),
    (re.compile(r"<\|python_tag\|>"), "Llama <|python_tag|>"),
    (re.compile(r"<\|?tool_calls?_begin\|?>|<｜tool▁calls▁begin｜>"), "DeepSeek tool-call tokens"),
]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class ToolCallSyntaxError(ValueError):
    """The text between the markers is not a list of Python calls with keyword arguments."""


def format_value(value: Any) -> str:
    """A Python literal for a JSON value: strings double-quoted with escapes (quotes, backslashes,
    newlines, control characters) and unicode kept as is; True/False/None; nested lists and dicts."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            raise ValueError(f"{value} has no literal in tool-call notation")
        return repr(value)
    if isinstance(value, str):
        # JSON's string escapes are all valid Python string escapes.
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{format_value(str(k))}: {format_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"a {type(value).__name__} has no literal in tool-call notation")


def format_calls(calls: list[ToolCall]) -> str:
    body = ", ".join(
        f"{c.name}(" + ", ".join(f"{k}={format_value(v)}" for k, v in c.arguments.items()) + ")" for c in calls
    )
    return f"{CALL_START}[{body}]{CALL_END}"


def parse_calls(text: str) -> list[ToolCall]:
    """Parse the text between the markers: `[name(key=value, ...), ...]`."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise ToolCallSyntaxError(f"not valid Python ({err.msg})") from None
    if not isinstance(tree.body, ast.List):
        raise ToolCallSyntaxError("expected a list of calls in square brackets, like [name(key=value)]")
    calls = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call):
            raise ToolCallSyntaxError(f"'{ast.unparse(node)}' is not a call; expected name(key=value)")
        name = _dotted_name(node.func)
        if name is None:
            raise ToolCallSyntaxError(f"'{ast.unparse(node.func)}' is not a function name")
        if node.args:
            raise ToolCallSyntaxError(
                f"{name}(...) has positional arguments; LFM tool calls use keyword arguments only"
            )
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise ToolCallSyntaxError(f"{name}(...) uses **kwargs; write each argument as key=value")
            try:
                arguments[keyword.arg] = ast.literal_eval(keyword.value)
            except (ValueError, SyntaxError):
                raise ToolCallSyntaxError(
                    f"argument {keyword.arg}={ast.unparse(keyword.value)} of {name}(...) is not a literal "
                    "(string, number, True/False/None, list or dict)"
                ) from None
        calls.append(ToolCall(name, arguments))
    return calls


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


@dataclass
class ToolCallBlocks:
    calls: list[ToolCall]
    text_before: str  # assistant text before the first call marker
    problem: str | None  # unbalanced markers or a call that does not parse


def find_tool_calls(content: str) -> ToolCallBlocks:
    """Every <|tool_call_start|>...<|tool_call_end|> block in an assistant message."""
    calls: list[ToolCall] = []
    position, first_start = 0, None
    while True:
        start = content.find(CALL_START, position)
        stray_end = content.find(CALL_END, position)
        if start == -1:
            if stray_end != -1:
                return ToolCallBlocks(
                    calls, _before(content, first_start), f"{CALL_END} without a {CALL_START} before it"
                )
            break
        if stray_end != -1 and stray_end < start:
            return ToolCallBlocks(calls, _before(content, first_start), f"{CALL_END} without a {CALL_START} before it")
        first_start = start if first_start is None else first_start
        end = content.find(CALL_END, start + len(CALL_START))
        if end == -1:
            return ToolCallBlocks(calls, _before(content, first_start), f"{CALL_START} without a closing {CALL_END}")
        inner = content[start + len(CALL_START) : end]
        if CALL_START in inner:
            return ToolCallBlocks(calls, _before(content, first_start), f"a second {CALL_START} before {CALL_END}")
        try:
            calls.extend(parse_calls(inner))
        except ToolCallSyntaxError as err:
            return ToolCallBlocks(
                calls, _before(content, first_start), f"the tool call {inner.strip()[:80]!r} does not parse: {err}"
            )
        position = end + len(CALL_END)
    return ToolCallBlocks(calls, _before(content, first_start), None)


THINKING = re.compile(r"<think>.*?</think>", re.S)  # compiled once: re.sub(..., flags=) costs ~30 us a call


def _before(content: str, first_start: int | None) -> str:
    text = content if first_start is None else content[:first_start]
    return THINKING.sub("", text).strip() if "<think>" in text else text.strip()


def foreign_format(content: str) -> str | None:
    """The name of a non-LFM tool-call format found in the text, if any."""
    for pattern, name in FOREIGN_FORMATS:
        if pattern.search(content):
            return name
    stripped = content.strip()
    if stripped.startswith(("{", "[")) and CALL_START not in stripped:
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            return None
        items = value if isinstance(value, list) else [value]
        if items and all(
            isinstance(i, dict) and "name" in i and ({"arguments", "parameters", "args"} & set(i)) for i in items
        ):
            return "a raw JSON function-call object"
    return None


def tool_call_is_valid(completion: str, tools: list | None = None) -> bool:
    """True when `completion` holds at least one LFM tool call whose markers are balanced, whose
    calls parse, and - when `tools` (JSON schemas or names) is given - whose functions all exist.

    Meant as a reward for RL on tool use:

        >>> tool_call_is_valid('<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>', tools=["get_weather"])
        True
    """
    blocks = find_tool_calls(completion)
    if blocks.problem is not None or not blocks.calls or foreign_format(completion):
        return False
    if tools is not None:
        known = tool_names(tools)
        return all(call.name in known for call in blocks.calls)
    return True


def tool_names(tools: list) -> set[str]:
    """Function names from a list of tool definitions (OpenAI-style schemas, bare schemas, or names)."""
    names = set()
    for tool in tools:
        if isinstance(tool, str):
            try:
                tool = json.loads(tool)
            except json.JSONDecodeError:
                names.add(tool)
                continue
        if isinstance(tool, dict):
            function = tool.get("function", tool)
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                names.add(function["name"])
    return names
