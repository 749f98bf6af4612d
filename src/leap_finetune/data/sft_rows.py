"""The SFT row contract: a `messages` list of {"role", "content"} turns.

Every row is checked; each problem names the field (`messages[2].content`) and what was expected.
A valid row is normalised: aliases resolved (`conversations`, ShareGPT `from`/`value`), typed text
parts joined into one string (what LFM2.5's template does itself, and what LFM2's would otherwise
JSON-dump verbatim into the prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from leap_finetune.config.suggest import did_you_mean
from leap_finetune.data.readers import SourceRow
from leap_finetune.data.tool_use import ToolNote, normalise_tool_use
from leap_finetune.errors import RowProblem

MESSAGE_COLUMNS = ("messages", "conversations", "conversation", "chat")
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "tool": "tool", "user": "user", "assistant": "assistant"}
# Passed through to the chat template: LFM2.5 reads `thinking`; structured tool calls are rendered
# by both LFM templates.
EXTRA_MESSAGE_KEYS = ("tool_calls", "name", "tool_call_id", "thinking", "reasoning", "reasoning_content")
TOOLS_COLUMN = "tools"


@dataclass
class Conversation:
    """A validated, normalised row: what the chat template renders."""

    messages: list[dict]
    tools: list | None = None  # tool definitions, rendered into the system prompt by the template


@dataclass(frozen=True)
class RowWarning:
    file: str
    location: str
    kind: str  # a key of tool_use.WARNINGS
    field: str


def check_sft_row(
    row: SourceRow, *, needs_assistant: bool = True, family: str = "other"
) -> tuple[Conversation | None, list[RowProblem], list[RowWarning]]:
    """Return (conversation, [], warnings) for a valid row, or (None, problems, warnings)."""
    problems: list[RowProblem] = []
    warnings: list[RowWarning] = []

    def note(tool_note: ToolNote) -> None:
        warnings.append(RowWarning(row.file, row.location, tool_note.kind, tool_note.field))

    def problem(field: str, text: str) -> None:
        problems.append(RowProblem(row.file, row.location, field, text))

    data = row.data
    if not isinstance(data, dict):
        problem("<row>", f"expected an object with a 'messages' list, got {_kind(data)}")
        return None, problems, warnings
    present = [c for c in MESSAGE_COLUMNS if c in data]
    if not present:
        columns = ", ".join(map(str, data)) or "none"
        hint = did_you_mean(next(iter(data), ""), MESSAGE_COLUMNS) if len(data) == 1 else ""
        problem("messages", f"missing: the row has no 'messages' list (columns found: {columns}) {hint}".rstrip())
        return None, problems, warnings
    if len(present) > 1:
        problem(present[1], f"the row has both '{present[0]}' and '{present[1]}'; keep one")
        return None, problems, warnings
    column = present[0]
    messages = data[column]
    if row.from_text_table and isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as err:
            problem(column, f"expected JSON text holding a list of messages ({err.msg} at column {err.colno})")
            return None, problems, warnings
    if not isinstance(messages, list):
        problem(column, f"expected a list of messages, got {_kind(messages)}")
        return None, problems, warnings
    if not messages:
        problem(column, "the list of messages is empty")
        return None, problems, warnings

    normalised = []
    for index, message in enumerate(messages):
        field = f"{column}[{index}]"
        turn = _check_message(message, field, problem)
        if turn is not None:
            normalised.append(turn)
    tools = _check_tools(data.get(TOOLS_COLUMN), row.from_text_table, problem)
    if problems:
        return None, problems, warnings
    if needs_assistant and not any(m["role"] == "assistant" for m in normalised):
        problem(column, "no assistant message: with loss on assistant tokens this row would train on nothing "
                "(add the assistant's answer, or set training_config.loss_on: all)")
        return None, problems, warnings
    for index, message in enumerate(normalised[1:], start=1):
        if message["role"] == "system":
            # Rendered in place as a turn of its own; only a first system message is the system prompt
            # (and gets the tool list). Often two conversations joined by mistake.
            warnings.append(RowWarning(row.file, row.location, "system_not_first", f"{column}[{index}]"))
    normalised = normalise_tool_use(normalised, tools, family, column, problem, note)
    if problems:
        return None, problems, warnings
    return Conversation(normalised, tools), [], warnings


def _check_tools(tools: Any, from_text_table: bool, problem) -> list | None:
    """The optional `tools` column: a list of tool definitions (JSON schemas), or its JSON text in CSV."""
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str) and from_text_table:
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            problem(TOOLS_COLUMN, f"expected JSON text holding a list of tool definitions ({err.msg})")
            return None
    if not isinstance(tools, list):
        problem(TOOLS_COLUMN, f"expected a list of tool definitions (JSON schemas), got {_kind(tools)}")
        return None
    parsed = []
    for index, tool in enumerate(tools):
        if isinstance(tool, str):
            try:
                tool = json.loads(tool)
            except json.JSONDecodeError:
                problem(f"{TOOLS_COLUMN}[{index}]", "a string that is not a JSON tool definition")
                return None
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            problem(f"{TOOLS_COLUMN}[{index}]", "expected a tool definition with a 'name' "
                    "(e.g. {\"name\": \"get_weather\", \"parameters\": {...}} or OpenAI's "
                    "{\"type\": \"function\", \"function\": {...}})")
            return None
        parsed.append(tool)
    return parsed


def _check_message(message: Any, field: str, problem) -> dict | None:
    if not isinstance(message, dict):
        problem(field, f"expected an object with 'role' and 'content', got {_kind(message)}")
        return None
    message = dict(message)
    if "role" not in message and "from" in message:  # ShareGPT
        sharegpt_role = message.pop("from")
        message["role"] = SHAREGPT_ROLES.get(sharegpt_role, sharegpt_role)
        if "value" in message and "content" not in message:
            message["content"] = message.pop("value")
    known = ("role", "content", *EXTRA_MESSAGE_KEYS)
    for key in message:
        if key not in known:
            hint = did_you_mean(str(key), known)
            problem(f"{field}.{key}", f"unknown message key '{key}' ({hint or 'expected role, content'})")
            return None
    role = message.get("role")
    if role is None:
        problem(f"{field}.role", "missing: every message needs a role (system, user, assistant or tool)")
        return None
    if role not in ROLES:
        hint = did_you_mean(str(role), ROLES)
        problem(f"{field}.role", f"'{role}' is not a role; expected one of {', '.join(ROLES)}" + (f" ({hint})" if hint else ""))
        return None
    if "content" not in message:
        if role == "assistant" and message.get("tool_calls"):
            message["content"] = ""
        else:
            problem(f"{field}.content", "missing: every message needs content (a string or a list of typed parts)")
            return None
    if message["content"] is None and not (role == "assistant" and message.get("tool_calls")):
        article = "an" if role == "assistant" else "a"
        problem(f"{field}.content", f"null: {article} {role} message needs content (only an assistant message "
                "with at least one tool call in tool_calls may have content null)")
        return None
    content = _normalise_content(message["content"], f"{field}.content", problem)
    if content is None:
        return None
    if role == "assistant" and not content.strip() and not message.get("tool_calls") and not message.get("thinking"):
        problem(f"{field}.content", "the assistant message is empty: it would train the model to answer with nothing")
        return None
    message["content"] = content
    return message


def _normalise_content(content: Any, field: str, problem) -> str | None:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        problem(field, f"expected a string or a list of typed parts, got {_kind(content)}")
        return None
    texts = []
    for index, part in enumerate(content):
        part_field = f"{field}[{index}]"
        if not isinstance(part, dict) or "type" not in part:
            problem(part_field, f"expected a typed part like {{\"type\": \"text\", \"text\": \"...\"}}, got {_kind(part)}")
            return None
        if part["type"] == "text":
            if not isinstance(part.get("text"), str):
                problem(f"{part_field}.text", f"a text part needs a string 'text', got {_kind(part.get('text'))}")
                return None
            texts.append(part["text"])
        elif part["type"] in ("image", "image_url", "audio", "video"):
            problem(part_field, f"a '{part['type']}' part needs a vision/audio model, and text SFT does not support it yet")
            return None
        else:
            problem(part_field, f"unknown part type '{part['type']}'; expected 'text'")
            return None
    return "".join(texts)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"a string ({shown!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
