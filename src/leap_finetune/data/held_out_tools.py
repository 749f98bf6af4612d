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

import numpy as np

from leap_finetune.data.tool_calls import CALL_START, LIST_END, LIST_START, find_tool_calls, tool_names
from leap_finetune.errors import LeapError

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


# ---- the data step's part (data/prepare.py): `streams` are data/row_check.py's Streams, `items` the sources ----


def check_hold_out(streams: list, items: list) -> None:
    """dataset.hold_out_tools, before the rows are split: every held-out tool is named by some row (a name no row uses
    is most often a typo), some row calls one (else the benchmark would be empty), and each source keeps rows to
    train on."""
    held_out = held_out_names(items)
    if not held_out:
        return
    where = "dataset.hold_out_tools" if len(items) == 1 else "dataset[].hold_out_tools"
    named = {name for s in streams for c in s.chunks for _, _, names in c.tool_rows for name in names}
    missing = sorted(held_out - named)
    if missing:
        from leap_finetune.config.suggest import did_you_mean

        known = sorted(named)
        hint = did_you_mean(missing[0], known)
        raise LeapError(
            f"no row names the tool(s) {', '.join(missing)} (held out by {where})" + (f"; {hint}" if hint else ""),
            where=where,
            fix="give the function names your rows call or define"
            + (f" (they name: {', '.join(known[:20])}{' ...' if len(known) > 20 else ''})" if known else "")
            + ", or remove the key",
        )
    if not any(c.unseen_tool_rows for s in streams for c in s.chunks):
        raise LeapError(
            f"no row calls a held-out tool: the rows naming {', '.join(sorted(held_out))} only list them among their "
            "tool definitions, so the unseen-tools benchmark would have no row to score",
            where=where,
            fix="hold out tools that your rows call, or remove the key",
        )
    for stream in streams:
        if not stream.held_out and stream.tool_held and not stream.valid:
            raise LeapError(
                f"every row of {stream.source.path} names a held-out tool ({', '.join(sorted(held_out))}): no training "
                "rows are left in it",
                where=where,
                fix="hold out fewer tools, give rows that do not list the held-out tools among their definitions, or "
                "remove the source",
            )


def tool_split_of(streams: list, items: list) -> tuple[dict, list[dict]]:
    """dataset.hold_out_tools: which tools went where (rows per split naming each tool; `held_out`: rows left out for
    naming a held-out tool, counted for every tool they name), and the benchmark rows of the held-out rows."""
    held_out = held_out_names(items)
    if not held_out:
        return {}, []
    split: dict[str, dict[str, int]] = {}
    unseen: list[dict] = []
    for stream in streams:
        kept = [
            names
            for chunk in stream.chunks
            for file, location, names in chunk.tool_rows
            if (file, location) not in stream.skip
        ]
        mask = stream.eval_mask if stream.eval_mask is not None else np.zeros(len(kept), dtype=bool)
        for names, to_eval in zip(kept, mask, strict=True):
            for name in names:
                split.setdefault(name, {"train": 0, "eval": 0, "held_out": 0})["eval" if to_eval else "train"] += 1
        for chunk in stream.chunks:
            for _, _, names in chunk.tool_rows:
                if held_out & set(names):  # (every tool such a row names: the held-out rows' other tools too)
                    for name in names:
                        split.setdefault(name, {"train": 0, "eval": 0, "held_out": 0})["held_out"] += 1
            unseen.extend(chunk.unseen_tool_rows)
    return dict(sorted(split.items())), unseen
