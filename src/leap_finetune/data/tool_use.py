"""Tool use in conversations, normalised for the LFM family that will be trained.

One function, `normalise_tool_use`, applies to every row of SFT data and (later) to preference and
RL data, so that every training type sees tool calls the same way:

- OpenAI-style structured `tool_calls` become LFM bracket notation in the assistant's content;
- response markers pre-baked into `role: "tool"` content are stripped (the LFM2 template adds them);
- LFM2.5: tool-list markers in the system prompt are stripped (LFM2.5 does not use them);
  LFM2: a tool list without them is warned about;
- foreign tool-call formats, calls that do not parse, unbalanced markers, calls with no tool
  result before the next user turn and tool results with no call are errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from leap_finetune.data import tool_calls as tc

LFM_FAMILIES = ("lfm2", "lfm2.5")
TOOL_LIST_HINT = "List of tools:"

# Warning kinds -> what each means (printed once per dataset with a count; see docs/tool-calling.md).
WARNINGS = {
    "tool_response_markers": "stripped <|tool_response_start|>/<|tool_response_end|> that were pre-baked into role "
    "'tool' content (the LFM2 template adds them itself; LFM2.5 does not use them)",
    "lfm25_tool_list_markers": "stripped <|tool_list_start|>/<|tool_list_end|> from the system prompt: LFM2.5 "
    "does not use them",
    "lfm2_missing_tool_list_markers": "the system prompt has a tool list without <|tool_list_start|>...<|tool_list_end|>, "
    "which LFM2 expects around it (or give the definitions in a `tools` column and they are rendered for you)",
    "text_before_tool_call": "assistant text before the tool call in the same turn: LFM2 expects the call first",
    "converted_tool_calls": "converted structured `tool_calls` to LFM bracket notation in the assistant content",
    "unknown_function": "a tool call names a function that is not in the row's tool list",
    # not about tools, but reported the same way (data/sft_rows.py)
    "system_not_first": "a system message after the first turn: it is rendered in place as a turn of its own; only "
    "a first system message is the system prompt (two conversations joined by mistake?)",
}


@dataclass
class ToolNote:
    kind: str  # a key of WARNINGS
    field: str


def normalise_tool_use(
    messages: list[dict],
    tools: list | None,
    family: str,
    column: str,
    problem: Callable[[str, str], None],
    note: Callable[[ToolNote], None],
) -> list[dict]:
    """Return the normalised messages; report errors through `problem(field, text)` and warnings
    through `note(ToolNote)`. Non-LFM families keep structured tool calls for their own template."""
    if family not in LFM_FAMILIES:
        return messages
    out = []
    for index, message in enumerate(messages):
        field = f"{column}[{index}]"
        message = dict(message)
        role = message["role"]
        if role == "tool":
            message["content"] = _strip_response_markers(message["content"], field, note)
        elif role == "system" and index == 0:
            message["content"] = _system_tool_list(message["content"], tools, family, field, problem, note)
        elif role == "assistant":
            message = _assistant(message, family, field, problem, note, tools)
        out.append(message)
    _check_call_sequence(out, column, problem)
    return out


def _strip_response_markers(content: str, field: str, note) -> str:
    if tc.RESPONSE_START in content or tc.RESPONSE_END in content:
        note(ToolNote("tool_response_markers", f"{field}.content"))
        content = content.replace(tc.RESPONSE_START, "").replace(tc.RESPONSE_END, "")
    return content


def _system_tool_list(content: str, tools, family: str, field: str, problem, note) -> str:
    has_markers = tc.LIST_START in content or tc.LIST_END in content
    has_list = has_markers or TOOL_LIST_HINT in content
    if tools and has_list:
        problem(
            f"{field}.content",
            "tool definitions are given twice: in the `tools` column and in the system prompt; "
            "keep one (the `tools` column is rendered into the system prompt for you)",
        )
        return content
    if family == "lfm2.5" and has_markers:
        note(ToolNote("lfm25_tool_list_markers", f"{field}.content"))
        return content.replace(tc.LIST_START, "").replace(tc.LIST_END, "")
    if family == "lfm2":
        if content.count(tc.LIST_START) != content.count(tc.LIST_END):
            problem(f"{field}.content", "unbalanced <|tool_list_start|> / <|tool_list_end|> in the system prompt")
        elif TOOL_LIST_HINT in content and not has_markers:
            note(ToolNote("lfm2_missing_tool_list_markers", f"{field}.content"))
    return content


def _assistant(message: dict, family: str, field: str, problem, note, tools) -> dict:
    content = message.get("content") or ""
    structured = message.pop("tool_calls", None)
    if structured:
        if tc.CALL_START in content:
            problem(
                f"{field}.tool_calls",
                "the message has both structured `tool_calls` and a bracket-notation call in `content`; keep one",
            )
            return message
        converted = convert_structured(structured, f"{field}.tool_calls", problem)
        if converted is None:
            return message
        note(ToolNote("converted_tool_calls", f"{field}.tool_calls"))
        content = content + converted
        message["content"] = content
    foreign = tc.foreign_format(content)
    if foreign:
        problem(
            f"{field}.content",
            f"found {foreign}; LFM models call tools as "
            f'{tc.CALL_START}[name(key="value")]{tc.CALL_END} in the assistant content '
            "(or give OpenAI-style `tool_calls` and they are converted)",
        )
        return message
    blocks = tc.find_tool_calls(content)
    if blocks.problem:
        problem(f"{field}.content", blocks.problem + f'; expected {tc.CALL_START}[name(key="value", n=3)]{tc.CALL_END}')
        return message
    if blocks.calls:
        message["_tool_calls"] = True  # for the sequence check; removed there
        if family == "lfm2" and blocks.text_before:
            note(ToolNote("text_before_tool_call", f"{field}.content"))
        if tools:
            known = tc.tool_names(tools)
            if known and any(call.name not in known for call in blocks.calls):
                note(ToolNote("unknown_function", f"{field}.content"))
    return message


def convert_structured(structured, field: str, problem) -> str | None:
    """OpenAI-style structured `tool_calls` as LFM bracket notation, or None (each mistake told to `problem`)."""
    if not isinstance(structured, list):
        problem(
            field,
            'expected a list of tool calls like [{"type": "function", "function": {"name": ..., "arguments": {...}}}]',
        )
        return None
    calls = []
    for index, item in enumerate(structured):
        item_field = f"{field}[{index}]"
        function = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            problem(item_field, 'expected {"function": {"name": "...", "arguments": {...}}}')
            return None
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as err:
                problem(f"{item_field}.function.arguments", f"a JSON string that does not parse ({err.msg})")
                return None
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            problem(f"{item_field}.function.arguments", "expected an object of keyword arguments (or its JSON text)")
            return None
        if not all(isinstance(k, str) and k.isidentifier() for k in arguments):
            problem(f"{item_field}.function.arguments", "argument names must be valid Python identifiers")
            return None
        calls.append(tc.ToolCall(function["name"], arguments))
    try:
        return tc.format_calls(calls)
    except ValueError as err:
        problem(field, str(err))
        return None


def _check_call_sequence(messages: list[dict], column: str, problem) -> None:
    """Every tool call is answered by a role 'tool' message before the conversation moves on, and
    every tool message answers a call. A call that ends the conversation is fine (the model learns
    to make it)."""
    open_call = None  # index of an assistant call not answered yet
    answered_call = None  # index of the call the latest tool messages answer
    for index, message in enumerate(messages):
        role = message["role"]
        makes_call = message.pop("_tool_calls", False)
        if role == "tool":
            if open_call is None and answered_call is None:
                problem(f"{column}[{index}]", "a role 'tool' message with no assistant tool call before it")
            answered_call = open_call if open_call is not None else answered_call
            open_call = None
            continue
        if open_call is not None:
            problem(
                f"{column}[{open_call}].content",
                f"tool call with no role 'tool' result before {column}[{index}] "
                f'({role}); add the tool\'s result as {{"role": "tool", "content": "..."}}',
            )
            open_call = None
        answered_call = None
        if makes_call:
            open_call = index
