"""The SFT row contract: a `messages` list of {"role", "content"} turns.

Every row is checked; each problem names the field (`messages[2].content`) and what was expected.
A valid row is normalised: column aliases resolved (`conversations`, ...), and each message by the
parser shared with the other row types (data/messages.py: ShareGPT `from`/`value`, typed text parts
joined into one string).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from leap_finetune.config.suggest import did_you_mean
from leap_finetune.data.messages import MESSAGE_COLUMNS, TOOLS_COLUMN, check_message, check_tools, describe_value
from leap_finetune.data.readers import SourceRow
from leap_finetune.data.tool_use import ToolNote, normalise_tool_use
from leap_finetune.errors import RowProblem


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
        problem("<row>", f"expected an object with a 'messages' list, got {describe_value(data)}")
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
        problem(column, f"expected a list of messages, got {describe_value(messages)}")
        return None, problems, warnings
    if not messages:
        problem(column, "the list of messages is empty")
        return None, problems, warnings

    normalised = []
    for index, message in enumerate(messages):
        field = f"{column}[{index}]"
        turn = check_message(message, field, problem)
        if turn is not None:
            normalised.append(turn)
    tools = check_tools(data.get(TOOLS_COLUMN), row.from_text_table, problem)
    if problems:
        return None, problems, warnings
    if needs_assistant and not any(m["role"] == "assistant" for m in normalised):
        problem(
            column,
            "no assistant message: with loss on assistant tokens this row would train on nothing "
            "(add the assistant's answer, or set training_config.loss_on: all)",
        )
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
