"""The SFT row contract: a `messages` list of {"role", "content"} turns.

Every row is checked; each problem names the field (`messages[2].content`) and what was expected.
A valid row is normalised: column aliases resolved (`conversations`, ...), and each message by the
parser shared with the other row types (data/messages.py: ShareGPT `from`/`value`, typed text parts
joined into one string).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from leap_finetune.config.suggest import did_you_mean
from leap_finetune.data.messages import (
    MESSAGE_COLUMNS,
    TOOLS_COLUMN,
    ImageParts,
    ImageRef,
    check_message,
    check_tools,
    describe_value,
)
from leap_finetune.data.readers import SourceRow
from leap_finetune.data.tool_use import ToolNote, normalise_tool_use
from leap_finetune.errors import RowProblem


@dataclass
class Conversation:
    """A validated, normalised row: what the chat template renders."""

    messages: list[dict]
    tools: list | None = None  # tool definitions, rendered into the system prompt by the template
    images: list[ImageRef] = field(default_factory=list)  # in order; `<image>` in the messages where each is


IMAGES_COLUMN = "images"


def image_parts(row: SourceRow, problem) -> ImageParts | None:
    """How a vision-language run reads a row's image parts: relative paths from dataset.image_root or the data
    file's folder, and the row's `images` column (Hub / TRL layout) for parts without a source."""
    data = row.data if isinstance(row.data, dict) else {}
    column = data.get(IMAGES_COLUMN)
    if column is not None and not isinstance(column, list):
        problem(
            IMAGES_COLUMN, f"expected a list of images (paths, data URIs or pictures), got {describe_value(column)}"
        )
        return None
    folder = Path(row.image_root) if getattr(row, "image_root", None) else Path(row.file).parent
    return ImageParts(folder, column)


def check_images_used(parts: ImageParts | None, problem) -> None:
    """Every entry of the `images` column belongs to an image part (a spare one is a misaligned row)."""
    if parts is not None and parts.column and parts.taken < len(parts.column):
        problem(
            IMAGES_COLUMN,
            f"the row's images column has {len(parts.column)} image(s) and its messages {parts.taken} image part(s) "
            'without a source; each {"type": "image"} part takes the next image, in order',
        )


@dataclass(frozen=True)
class RowWarning:
    file: str
    location: str
    kind: str  # a key of tool_use.WARNINGS
    field: str


def check_sft_row(
    row: SourceRow,
    *,
    needs_assistant: bool = True,
    family: str = "other",
    takes_images: bool = False,
    thinking_dropped_by: str | None = None,
) -> tuple[Conversation | None, list[RowProblem], list[RowWarning]]:
    """Return (conversation, [], warnings) for a valid row, or (None, problems, warnings). `thinking_dropped_by`:
    the chat template, where it does not render an assistant's `thinking` field (such a row is refused)."""
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

    parts = image_parts(row, problem) if takes_images else None
    if problems:
        return None, problems, warnings
    normalised = []
    for index, message in enumerate(messages):
        turn = check_message(message, f"{column}[{index}]", problem, images=parts)
        if turn is not None:
            normalised.append(turn)
    if not problems:
        check_images_used(parts, problem)
    tools = check_tools(data.get(TOOLS_COLUMN), row.from_text_table, problem)
    if thinking_dropped_by is not None:
        _check_thinking_rendered(normalised, column, thinking_dropped_by, problem)
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
    return Conversation(normalised, tools, list(parts.found) if parts is not None else []), [], warnings


def _check_thinking_rendered(messages: list[dict], column: str, template: str, problem) -> None:
    """An assistant's reasoning in a field the chat template does not render would be dropped from training."""
    from leap_finetune.data.chat_templates import THINKING_FIELDS

    for index, message in enumerate(messages):
        field = next((f for f in THINKING_FIELDS if message.get(f)), None) if message["role"] == "assistant" else None
        if field is not None:
            problem(
                f"{column}[{index}].{field}",
                f"the chat template '{template}' does not render an assistant's {field}: it would be dropped from "
                "training without a word; use chat_template: lfm2.5 (it renders it as <think>...</think>), or put "
                "the reasoning at the start of content as <think>...</think>",
            )
            return
