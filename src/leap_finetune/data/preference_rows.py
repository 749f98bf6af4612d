"""Row contracts for preference data: DPO (`prompt`, `chosen`, `rejected`) and KTO (`prompt`,
`completion`, `label`).

Each field is a plain string or a list of messages. A string prompt is one user turn; a string
completion is one assistant turn. Multi-turn: `prompt` is the shared history (any roles, not ending
with the assistant), completions are assistant messages (with tool calls if any). DPO rows without
`prompt` whose `chosen` and `rejected` are full conversations get the shared leading messages as
their prompt. Tool use is normalised with the same function as SFT data.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from leap_finetune.data.messages import TOOLS_COLUMN, ImageParts, ImageRef, check_message, check_tools, describe_value
from leap_finetune.data.readers import SourceRow
from leap_finetune.data.sft_rows import RowWarning, check_images_used, image_parts
from leap_finetune.data.tool_use import ToolNote, normalise_tool_use
from leap_finetune.errors import RowProblem

TRUE_STRINGS, FALSE_STRINGS = ("true",), ("false",)


@dataclass
class PreferenceRow:
    """DPO: one prompt, a preferred and a rejected completion."""

    prompt: list[dict]
    chosen: list[dict]
    rejected: list[dict]
    tools: list | None = None
    implicit_prompt: bool = False
    images: list[ImageRef] = dataclasses.field(default_factory=list)  # the prompt's, in order (vision-language)


@dataclass
class KtoRow:
    """KTO: one prompt, one completion, and whether that completion is desirable."""

    prompt: list[dict]
    completion: list[dict]
    label: bool
    tools: list | None = None


class RowChecker:
    """One row's fields checked into messages, its problems and warnings gathered (GRPO's `prompt` rows too)."""

    def __init__(self, row: SourceRow, family: str, takes_images: bool = False):
        self.row = row
        self.family = family
        self.problems: list[RowProblem] = []
        self.warnings: list[RowWarning] = []
        # a vision-language run: image parts in the prompt's user turns (completions are the model's text)
        self.images: ImageParts | None = image_parts(row, self.problem) if takes_images else None

    def problem(self, field: str, text: str) -> None:
        self.problems.append(RowProblem(self.row.file, self.row.location, field, text))

    def note(self, tool_note: ToolNote) -> None:
        self.warnings.append(RowWarning(self.row.file, self.row.location, tool_note.kind, tool_note.field))

    def field(self, name: str, *, required: bool = True) -> Any:
        data = self.row.data
        if name not in data or data[name] is None or data[name] == "" or data[name] == []:
            if required:
                found = ", ".join(map(str, data)) or "none"
                self.problem(name, f"missing or empty (columns found: {found})")
            return None
        value = data[name]
        if self.row.from_text_table and isinstance(value, str) and value.lstrip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                self.problem(name, f"looks like a JSON list of messages but does not parse ({err.msg})")
                return None
        return value

    def messages(self, name: str, value: Any, default_role: str) -> list[dict] | None:
        """A string becomes one message of `default_role`; a list is checked message by message."""
        if isinstance(value, str):
            if not value.strip():
                self.problem(name, "is empty")
                return None
            return [{"role": default_role, "content": value}]
        if not isinstance(value, list):
            self.problem(name, f"expected a string or a list of messages, got {describe_value(value)}")
            return None
        before = len(self.problems)
        images = self.images if name == "prompt" else self._completion_images()
        checked = [
            check_message(message, f"{name}[{i}]", self.problem, images=images) for i, message in enumerate(value)
        ]
        if images is not None and images is not self.images and images.found:
            self.problem(
                images.found[0].field,
                f"an image in {name}: images go in the prompt's user turns (write the row with a `prompt` that "
                "holds the image and the question, and chosen/rejected as the answers)",
            )
        out = [message for message in checked if message is not None]
        return out if len(self.problems) == before else None

    def _completion_images(self) -> ImageParts | None:
        """A vision-language run reads image parts everywhere (to say where they belong), keeps the prompt's only."""
        return None if self.images is None else ImageParts(self.images.folder)

    def completion(self, name: str, value: Any) -> list[dict] | None:
        messages = self.messages(name, value, "assistant")
        if messages is None:
            return None
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                self.problem(
                    f"{name}[{index}].role",
                    f"'{message['role']}' in a completion: completions hold only "
                    "assistant messages (put earlier turns in `prompt`)",
                )
                return None
        return messages

    def prompt(self, value: Any) -> list[dict] | None:
        messages = self.messages("prompt", value, "user")
        if messages is None:
            return None
        if messages[-1]["role"] == "assistant":
            self.problem(
                f"prompt[{len(messages) - 1}].role",
                "the prompt ends with an assistant turn, so the "
                "completion would continue it; end the prompt with the user (or tool) turn the completion answers",
            )
            return None
        return messages

    def same_shape(self, names: list[str]) -> bool:
        shapes = {
            name: isinstance(self.row.data.get(name), str) for name in names if self.row.data.get(name) is not None
        }
        if len(set(shapes.values())) > 1:
            strings = [n for n, s in shapes.items() if s]
            lists = [n for n, s in shapes.items() if not s]
            self.problem(
                ", ".join(names),
                f"mixed shapes: {', '.join(strings)} a string but {', '.join(lists)} a list "
                "of messages; use strings for all of them or message lists for all of them",
            )
            return False
        return True

    def normalise(
        self, prompt: list[dict], completion: list[dict], tools, name: str
    ) -> tuple[list[dict], list[dict]] | None:
        """Tool-use normalisation over the whole conversation, split back into prompt and completion."""
        before = len(self.problems)
        conversation = normalise_tool_use(
            prompt + completion, tools, self.family, f"prompt+{name}", self.problem, self.note
        )
        if len(self.problems) != before:
            return None
        return conversation[: len(prompt)], conversation[len(prompt) :]


def check_dpo_row(
    row: SourceRow, *, family: str = "other", takes_images: bool = False
) -> tuple[PreferenceRow | None, list[RowProblem], list[RowWarning]]:
    c = RowChecker(row, family, takes_images and isinstance(row.data, dict))
    if not isinstance(row.data, dict):
        c.problem("<row>", f"expected an object with prompt, chosen and rejected, got {describe_value(row.data)}")
        return None, c.problems, c.warnings
    implicit = "prompt" not in row.data or row.data.get("prompt") in (None, "", [])
    chosen_raw, rejected_raw = c.field("chosen"), c.field("rejected")
    tools = check_tools(row.data.get(TOOLS_COLUMN), row.from_text_table, c.problem)
    if c.problems or not c.same_shape(["prompt", "chosen", "rejected"]):
        return None, c.problems, c.warnings
    if implicit:
        split = _implicit_prompt(c, chosen_raw, rejected_raw)
        if split is None:
            return None, c.problems, c.warnings
        prompt, chosen, rejected = split
    else:
        prompt = c.prompt(row.data["prompt"])
        chosen = c.completion("chosen", chosen_raw)
        rejected = c.completion("rejected", rejected_raw)
    if c.problems:
        return None, c.problems, c.warnings
    if chosen == rejected:
        c.problem("chosen, rejected", "chosen and rejected are identical: the pair carries no preference")
        return None, c.problems, c.warnings
    normal_chosen = c.normalise(prompt, chosen, tools, "chosen")
    normal_rejected = c.normalise(prompt, rejected, tools, "rejected")
    if normal_chosen is None or normal_rejected is None:
        return None, c.problems, c.warnings
    check_images_used(c.images, c.problem)
    if c.problems:
        return None, c.problems, c.warnings
    images = list(c.images.found) if c.images is not None else []
    return (
        PreferenceRow(normal_chosen[0], normal_chosen[1], normal_rejected[1], tools, implicit, images),
        [],
        c.warnings,
    )


def _implicit_prompt(c: RowChecker, chosen_raw, rejected_raw):
    if isinstance(chosen_raw, str):
        c.problem(
            "prompt",
            "missing: with plain-string chosen/rejected a `prompt` is required (only full "
            "conversations can share their prompt implicitly)",
        )
        return None
    chosen = c.messages("chosen", chosen_raw, "assistant")
    rejected = c.messages("rejected", rejected_raw, "assistant")
    if chosen is None or rejected is None:
        return None
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    # The prompt may not end with an assistant turn: back off to the last non-assistant message.
    while shared and chosen[shared - 1]["role"] == "assistant":
        shared -= 1
    if shared == 0:
        c.problem(
            "prompt",
            "missing, and chosen and rejected share no leading user turn to use as the prompt; "
            "add a `prompt` field or start both conversations with the same messages",
        )
        return None
    prompt, chosen_tail, rejected_tail = chosen[:shared], chosen[shared:], rejected[shared:]
    for name, tail in (("chosen", chosen_tail), ("rejected", rejected_tail)):
        if not tail:
            c.problem(name, "has nothing after the prompt it shares with the other completion")
            return None
        for index, message in enumerate(tail, start=shared):
            if message["role"] != "assistant":
                c.problem(
                    f"{name}[{index}].role",
                    f"'{message['role']}' after the shared prompt: completions hold only assistant messages",
                )
                return None
    return prompt, chosen_tail, rejected_tail


def check_kto_row(row: SourceRow, *, family: str = "other") -> tuple[KtoRow | None, list[RowProblem], list[RowWarning]]:
    c = RowChecker(row, family)
    if not isinstance(row.data, dict):
        c.problem("<row>", f"expected an object with prompt, completion and label, got {describe_value(row.data)}")
        return None, c.problems, c.warnings
    prompt_raw, completion_raw = c.field("prompt"), c.field("completion")
    label = _label(c, row.data.get("label", None), "label" in row.data)
    tools = check_tools(row.data.get(TOOLS_COLUMN), row.from_text_table, c.problem)
    if c.problems or not c.same_shape(["prompt", "completion"]):
        return None, c.problems, c.warnings
    prompt = c.prompt(prompt_raw)
    completion = c.completion("completion", completion_raw)
    if c.problems:
        return None, c.problems, c.warnings
    normal = c.normalise(prompt, completion, tools, "completion")
    if normal is None:
        return None, c.problems, c.warnings
    return KtoRow(normal[0], normal[1], label, tools), [], c.warnings


def _label(c: RowChecker, value: Any, present: bool) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE_STRINGS + FALSE_STRINGS:
        return value.strip().lower() in TRUE_STRINGS
    if not present:
        c.problem("label", "missing: KTO rows need a boolean label (true = desirable completion)")
    else:
        c.problem(
            "label", f'expected true or false (a boolean, or the strings "true"/"false"), got {describe_value(value)}'
        )
    return None
