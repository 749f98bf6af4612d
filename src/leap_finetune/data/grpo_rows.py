"""The GRPO row contract: a prompt to generate from, an optional reference answer (`solution`), and
any other columns, passed through to the reward functions.

Two shapes:
- `messages` (as for SFT): the prompt is every turn before the last assistant turn, which becomes the
  `solution`; without an assistant turn the whole conversation is the prompt (no solution).
- `prompt` (a string, or a list of messages) and an optional `solution` (a string or a number).
Rows keep their `tools`. The prompt must end with a user (or tool) turn: the model answers it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from leap_finetune.data.messages import MESSAGE_COLUMNS, TOOLS_COLUMN, check_tools, describe_value
from leap_finetune.data.preference_rows import RowChecker
from leap_finetune.data.readers import SourceRow
from leap_finetune.data.sft_rows import RowWarning, check_sft_row
from leap_finetune.errors import RowProblem

OWN_COLUMNS = {"prompt", "solution", TOOLS_COLUMN, *MESSAGE_COLUMNS}
# Columns leap-finetune adds for the reward functions.
ADDED_COLUMNS = ("prompt_text",)


@dataclass
class GrpoRow:
    prompt: list[dict]
    solution: str | None
    tools: list | None = None
    extra: dict = field(default_factory=dict)  # the row's other columns, for the reward functions
    images: list = field(default_factory=list)  # a vision-language run: the prompt's images (ImageRef), in order


def check_grpo_row(
    row: SourceRow, *, family: str = "other", environment_tools: list | None = None, takes_images: bool = False
) -> tuple[GrpoRow | None, list[RowProblem], list[RowWarning]]:
    """The row checked; with an `environment:` (`environment_tools`: its tool definitions) the prompt is shown the
    environment's tools, and a row may not bring its own. `takes_images`: a vision-language run, whose prompts may
    hold image parts (as SFT's and DPO's rows)."""
    checked, problems, warnings = _check_grpo_row(row, family, takes_images)
    if checked is None or environment_tools is None:
        return checked, problems, warnings
    if checked.tools:
        problem = RowProblem(
            row.file,
            row.location,
            TOOLS_COLUMN,
            "the row has its own `tools`; with `environment:` every prompt is shown the environment's tools "
            "(environment.tools): remove the column, or drop `environment:` to train single turns",
        )
        return None, [problem], warnings
    checked.tools = list(environment_tools)
    return checked, problems, warnings


def _check_grpo_row(
    row: SourceRow, family: str, takes_images: bool = False
) -> tuple[GrpoRow | None, list[RowProblem], list[RowWarning]]:
    c = RowChecker(row, family, takes_images and isinstance(row.data, dict))
    data = row.data
    if not isinstance(data, dict):
        c.problem(
            "<row>", f"expected an object with `prompt` (and `solution`) or `messages`, got {describe_value(data)}"
        )
        return None, c.problems, c.warnings
    extra = {k: v for k, v in data.items() if k not in OWN_COLUMNS}
    for name in ADDED_COLUMNS:
        if name in extra:
            c.problem(name, f"'{name}' is a column leap-finetune adds for the reward functions; rename yours")
    message_column = next((k for k in MESSAGE_COLUMNS if k in data), None)
    if message_column is not None and "prompt" in data:
        c.problem(f"{message_column}, prompt", "a row gives either `messages` or `prompt` (+ `solution`), not both")
        return None, c.problems, c.warnings
    if message_column is not None:
        if "solution" in data:
            c.problem(
                "solution",
                "with `messages` the solution is the last assistant turn; drop `solution` or "
                "give `prompt` instead of `messages`",
            )
            return None, c.problems, c.warnings
        conversation, problems, warnings = check_sft_row(
            row, needs_assistant=False, family=family, takes_images=takes_images
        )
        c.warnings.extend(warnings)
        if conversation is None:
            return None, problems + c.problems, c.warnings
        messages = conversation.messages
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        solution = None
        if last is not None:
            answer = messages[last]
            solution = answer.get("content") or (json.dumps(answer["tool_calls"]) if answer.get("tool_calls") else None)
            messages = messages[:last]
        if not messages:
            c.problem(
                f"{message_column}[0]", "the conversation starts with the assistant turn: there is no prompt to answer"
            )
        elif messages[-1]["role"] == "assistant":
            c.problem(f"{message_column}[{len(messages) - 1}]", "the prompt would end with an assistant turn")
        if c.problems:
            return None, c.problems, c.warnings
        return GrpoRow(messages, solution, conversation.tools, extra, list(conversation.images)), [], c.warnings
    tools = check_tools(data.get(TOOLS_COLUMN), row.from_text_table, c.problem)
    raw = c.field("prompt")
    solution = data.get("solution")
    if solution is not None and not isinstance(solution, str):
        if isinstance(solution, (int, float)) and not isinstance(solution, bool):
            solution = str(solution)
        else:
            c.problem("solution", f"expected a string (or a number), got {describe_value(solution)}")
    if raw is None or c.problems:
        return None, c.problems, c.warnings
    prompt = c.prompt(raw)
    if prompt is None:
        return None, c.problems, c.warnings
    if c.problems:
        return None, c.problems, c.warnings
    from leap_finetune.data.sft_rows import check_images_used

    check_images_used(c.images, c.problem)
    if c.problems:
        return None, c.problems, c.warnings
    images = list(c.images.found) if c.images is not None else []
    return GrpoRow(prompt, solution if solution != "" else None, tools, extra, images), [], c.warnings


@dataclass
class GrpoPrompt:
    """A prepared GRPO row: the prompt as the model sees it (chat template applied, generation prompt
    added), its token count, the solution and the passed-through columns."""

    prompt_text: str
    prompt_ids: list[int]
    solution: str | None
    plain_prompt: str
    extra: dict
    meta: dict = field(default_factory=dict)
    tools: list | None = None
    # a vision-language run (every row has these columns): the prompt's messages for TRL, which renders them with
    # the processor and the images; the images' sources in the order of their `<image>` placeholders
    messages: list | None = None
    images: list[str] | None = None

    @property
    def tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def trained_tokens(self) -> int:
        return len(self.prompt_ids)  # prompts are not truncated; completions are generated during training

    @property
    def truncated(self) -> bool:
        return False

    @property
    def tools_json(self) -> str:
        # The row's tools as JSON text ("" without): tool schemas differ from row to row, which an Arrow column of
        # structs cannot hold; a reward gets them as `tools` (tool_call_valid reads them).
        return json.dumps(self.tools, ensure_ascii=False) if self.tools else ""

    def columns(self) -> dict:
        columns = {
            "prompt": self.prompt_text,
            "solution": self.solution or "",
            "prompt_text": self.plain_prompt,
            "tools": self.tools_json,
            **self.extra,
        }
        if self.messages is not None:  # (a vision-language run: recipes/grpo_images.py reads these two)
            columns["prompt_messages"] = json.dumps(self.messages, ensure_ascii=False)
            columns["images"] = list(self.images or [])
        return columns

    def inspect(self) -> dict:
        # (prompt_text, tools: what the reward functions get; validate calls custom rewards with them)
        return {
            "prompt": self.prompt_text,
            "solution": self.solution,
            "prompt_tokens": len(self.prompt_ids),
            "prompt_text": self.plain_prompt,
            **({"tools": self.tools_json} if self.tools else {}),
            **({"columns": self.extra} if self.extra else {}),
        }


def prepare_prompt(renderer, row: GrpoRow) -> GrpoPrompt:
    text = renderer.prompt_text(row.prompt, row.tools)
    ids = renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
    plain = (
        row.prompt[-1]["content"]
        if len(row.prompt) == 1
        else "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in row.prompt)
    )
    prepared = GrpoPrompt(text, ids, row.solution, plain, row.extra, tools=row.tools)
    reader = getattr(renderer, "reader", None)
    if reader is not None:  # a vision-language run (data/images.py VisionRenderer)
        prepared.messages, prepared.images = row.prompt, [ref.source for ref in row.images]
        if row.images:  # the prompt's tokens as the model reads them: each <image> expanded to its tokens
            from leap_finetune.data.images import image_sizes
            from leap_finetune.data.render import TokenizedRow

            sizes = image_sizes(renderer, row.images)
            expanded, _, layouts = renderer.expand(TokenizedRow(text, ids, ids, []), sizes)
            prepared.prompt_ids = expanded.tolist()
            prepared.meta["images"] = [
                {"image": ref.source, "size": f"{w}x{h}", "tiles": layout.tiles, "tokens": len(layout.ids)}
                for ref, (w, h), layout in zip(row.images, sizes, layouts, strict=True)
            ]
    return prepared


def column_kind_problems(kinds) -> list[RowProblem]:
    """The passed-through columns are stored in Arrow: each must hold one kind of value in every row (or be
    missing / null). `kinds` gives (file, location, {column: kind}) per valid row, in order (the data step's
    chunks send these, not the rows); a row that breaks that is a problem naming the column and the first
    row's kind."""
    first: dict[str, tuple[str, str]] = {}
    problems = []
    for file, location, row_kinds in kinds:
        for name, kind in row_kinds.items():
            if name not in first:
                first[name] = (kind, location)
            elif first[name][0] != kind:
                seen_kind, seen_location = first[name]
                problems.append(
                    RowProblem(
                        file,
                        location,
                        name,
                        f"is {kind}, but {seen_kind} in {seen_location}: a column passed to the "
                        "reward functions holds one kind of value in every row",
                    )
                )
    return problems


def category(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__
