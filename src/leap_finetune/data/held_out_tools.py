"""`dataset.hold_out_tools`: rows that name a held-out tool leave training, and become a benchmark.

A row names a tool when it calls it (an assistant turn, a GRPO solution) or lists it among its tool definitions (a
`tools` column, or the tool list of the system prompt): a tool the model has only seen defined is not unseen. Such
a row is left out of the training and evaluation rows of every source, and each of its assistant turns that calls a
held-out tool becomes one row of the `unseen_tools` benchmark (metric tool_call): the conversation up to that turn
is the prompt, the turn with its calls the reference. Run folders keep the benchmark in prepared/ (runs/folder.py).
"""

from __future__ import annotations

import json
import re

from leap_finetune.data.tool_calls import CALL_START, LIST_END, LIST_START, find_tool_calls, tool_names

UNSEEN_TOOLS_BENCHMARK = "unseen_tools"
_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


def held_out_names(items) -> frozenset[str]:
    """Every source's `hold_out_tools`, together: a tool held out of one source is held out of all."""
    return frozenset(name for item in items for name in (item.hold_out_tools or []))


def tools_named(parsed) -> set[str]:
    """The tools a valid row names: a Conversation (sft) or a GrpoRow (grpo)."""
    messages = getattr(parsed, "messages", None) or getattr(parsed, "prompt", None) or []
    names = tool_names(parsed.tools) if parsed.tools else set()
    for index, message in enumerate(messages):
        content = message.get("content")
        content = content if isinstance(content, str) else ""
        if message.get("role") == "system" and index == 0:
            names |= _system_tool_list(content)
        elif message.get("role") == "assistant":
            names |= _calls(message)
    solution = getattr(parsed, "solution", None)
    if solution:
        names |= _calls({"content": solution})
    return names


def benchmark_rows(parsed, file: str, location: str, held_out: frozenset[str]) -> list[dict]:
    """The row's assistant turns that call a held-out tool, each as a benchmark row (messages up to and with the
    turn). Its turns that call only other tools are not trained on either, but measure seen tools: left out."""
    messages = list(getattr(parsed, "messages", None) or getattr(parsed, "prompt", None) or [])
    solution = getattr(parsed, "solution", None)
    if solution:  # grpo: the prompt's answer (structured calls as JSON text: given back as tool_calls)
        messages.append(_solution_turn(solution))
    rows = []
    for index, message in enumerate(messages):
        if index and message.get("role") == "assistant" and _calls(message) & held_out:
            row = {"messages": [_plain(m) for m in messages[: index + 1]]}
            if parsed.tools:
                row["tools"] = parsed.tools
            row["held_out_from"] = f"{file}, {location}"  # (not read by the benchmark: where the row came from)
            rows.append(row)
    return rows


def _solution_turn(solution: str) -> dict:
    """A GRPO solution as the reference turn: its text, or - for a family that keeps structured calls, whose
    solution is their JSON text - the calls as `tool_calls` (the benchmark converts them to LFM notation)."""
    if CALL_START not in solution and solution.lstrip().startswith("["):
        try:
            calls = json.loads(solution)
        except json.JSONDecodeError:
            calls = None
        if isinstance(calls, list) and calls and tool_names(calls):
            return {"role": "assistant", "content": None, "tool_calls": calls}
    return {"role": "assistant", "content": solution}


def _calls(message: dict) -> set[str]:
    content = message.get("content")
    names = set()
    if isinstance(content, str) and CALL_START in content:
        names |= {call.name for call in find_tool_calls(content).calls}
    elif isinstance(content, str) and content.lstrip().startswith("["):  # a grpo solution of structured calls (JSON)
        try:
            names |= tool_names(json.loads(content))
        except (json.JSONDecodeError, TypeError):
            pass
    structured = message.get("tool_calls")  # (kept by families other than LFM's)
    if isinstance(structured, list):
        names |= tool_names(structured)
    return names


def _system_tool_list(content: str) -> set[str]:
    """Names in the system prompt's tool list: between <|tool_list_start|> and <|tool_list_end|> when the markers are
    there (LFM2), else after `List of tools:` (LFM2.5). The `"name": "..."` keys are read without parsing the list (a
    description may hold anything)."""
    start = content.find(LIST_START)
    if start != -1:
        end = content.find(LIST_END, start)
        content = content[start : end if end != -1 else len(content)]
    elif "List of tools:" in content:
        content = content[content.find("List of tools:") :]
    # else: the whole system prompt (LFM2.5's normalisation has removed the markers from it by now)
    return {json.loads(f'"{name}"') for name in _NAME.findall(content)}


def _plain(message: dict) -> dict:
    return {k: v for k, v in message.items() if v is not None}
