"""Benchmark rows in the Hugging Face messages schema, validated up front like training data.

- Generation: the last assistant turn is the reference; everything before it is the prompt.
- Log-prob multiple choice: no assistant turn; `options` (two or more non-empty strings) and
  `answer_id` (the index of the correct option).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from leap_finetune.config.schema_evals import LOGPROB_METRICS, BenchmarkConfig
from leap_finetune.data.messages import MESSAGE_COLUMNS, ROLES, describe_value, parse_content
from leap_finetune.data.readers import SourceRow, read_dataset
from leap_finetune.data.tool_calls import find_tool_calls
from leap_finetune.data.tool_use import convert_structured
from leap_finetune.errors import DataError, LeapError, RowProblem
from leap_finetune.evaluation.metrics import NORMALISATION, scored_reference


@dataclass
class BenchmarkItem:
    file: str
    location: str
    prompt: list[dict]  # messages the model sees (content as text)
    reference: str | None = None  # generation benchmarks
    options: list[str] | None = None  # log-prob multiple choice
    answer_id: int | None = None
    images: list[str] = field(default_factory=list)
    tools: list | None = None  # the row's `tools` column: tool definitions the chat template renders
    reference_calls: list | None = None  # metric tool_call: the reference turn's calls ([]: it makes none)
    extra: dict = field(default_factory=dict)  # metric episodes: the row's other columns, for reset(row)


def is_logprob(metric: str) -> bool:
    return metric in LOGPROB_METRICS


def load_benchmark(bench: BenchmarkConfig, *, vision: bool, model_name: str) -> list[BenchmarkItem]:
    """Every row of a benchmark, or a DataError listing every problem (file, row, field)."""
    result = read_dataset(bench.path, limit=bench.limit, key=f"evals.benchmarks ('{bench.name}') path")
    problems = list(result.problems)
    items = []
    for row in result.rows:
        if bench.metric == "episodes":  # (GRPO rows, played by evaluation/episodes_benchmark.py)
            item = episode_item(row, model_name, problems)
        else:
            item = _check_row(row, bench, vision=vision, model_name=model_name, problems=problems)
        if item is not None:
            items.append(item)
    if problems:
        raise DataError(
            problems=problems,
            total_rows=len(result.rows) + len(result.problems),
            title=f"benchmark '{bench.name}'",
            fix_text="correct the benchmark rows listed above (every benchmark row is scored, so "
            "there is no skipping; to leave rows out, remove them or use the benchmark's `limit`)",
        )
    if bench.metric == "tool_call" and items and not any(item.reference_calls for item in items):
        # (a model that never calls a tool would score 1.000: a score over nothing, not a perfect one)
        raise LeapError(
            f"benchmark '{bench.name}' (metric tool_call): none of its {len(items)} row(s) has a tool call in its "
            "reference turn (the last assistant message), so every model that calls no tool would score 1.000",
            where=bench.path,
            fix="give the rows' reference turns the calls the model should make (<|tool_call_start|>[name(key=value)]"
            "<|tool_call_end|>, or tool_calls: [...]); rows without a call still count, as the cases where no call "
            "is right; for answers without calls use metric exact_match or short_answer",
        )
    if bench.metric in ("grounding_iou", "iou@0.5"):
        from leap_finetune.data.boxes import box_problem

        # (an answer can only be scored against a box with area: a row without one would score 0 whatever)
        without = [(item, why) for item in items if (why := box_problem(item.reference)) is not None]
        if without:
            (first, why) = without[0]
            raise LeapError(
                f"benchmark '{bench.name}' (metric {bench.metric}): {len(without)} of its {len(items)} row(s) have no "
                f"box to score against in their reference answer, e.g. {first.file}, {first.location}: {why}",
                where=bench.path,
                fix="give each row's reference turn (the last assistant message) its box as [x1, y1, x2, y2] with "
                "x2 > x1 and y2 > y1 (or a JSON list of boxes), or use another metric for those rows",
            )
    return items


def _check_row(
    row: SourceRow, bench: BenchmarkConfig, *, vision: bool, model_name: str, problems: list[RowProblem]
) -> BenchmarkItem | None:
    """The row as a benchmark item, or None with its problems added to `problems`."""
    start = len(problems)

    def problem(field_name: str, text: str) -> None:
        problems.append(RowProblem(row.file, row.location, field_name, text))

    data = row.data
    if not isinstance(data, dict):
        problem("<row>", f"expected an object with 'messages', got {describe_value(data)}")
        return None
    messages = _messages(row, data, problem)
    if messages is None:
        return None
    folder = Path(bench.image_root) if getattr(bench, "image_root", None) else Path(row.file).parent
    turns, images = _turns(messages, folder, problem)
    if images and not vision:
        problem(
            "messages",
            f"the row has an image, but model '{model_name}' is text-only; use a vision-language "
            "model (LFM2-VL) or remove image rows from benchmark '" + bench.name + "'",
        )
    if len(problems) > start:
        return None
    if is_logprob(bench.metric):
        return _mcq(row, data, turns, images, problem, bench)
    item = _generation(row, data, turns, images, problem, bench)
    return item if len(problems) == start else None


def _messages(row: SourceRow, data: dict, problem) -> list | None:
    """The row's messages column (`messages`, or another name it goes by; JSON text in a CSV or TSV file)."""
    column = next((c for c in MESSAGE_COLUMNS if c in data), None)
    messages = data.get(column) if column else None
    if row.from_text_table and isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as err:
            problem("messages", f"expected JSON text holding a list of messages ({err.msg})")
            return None
    if not isinstance(messages, list) or not messages:
        problem("messages", "missing or empty: benchmark rows hold a 'messages' list")
        return None
    return messages


def _turns(messages: list, folder: Path, problem) -> tuple[list[dict], list[str]]:
    """(each message as role and text, the image sources in order). Image paths are relative to the benchmark
    file's `folder`. Image parts are always read here, also for a text-only model: such a row is then one problem
    naming the model instead of a refused part."""
    turns, images = [], []
    for index, message in enumerate(messages):
        field_name = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            problem(f"{field_name}.role", f"expected a message with a role in {', '.join(ROLES)}")
            continue
        message = _with_calls_in_content(message, field_name, problem)
        if message is None:
            continue
        content = parse_content(message.get("content"), f"{field_name}.content", problem, image_folder=folder)
        if content is not None and content.images and message["role"] != "user":
            # (was accepted here, then failed at every evaluation with transformers' words)
            problem(
                f"{field_name}.content",
                f"an image in a{'n' if message['role'][0] in 'aeiou' else ''} {message['role']} turn: the model "
                "reads images, it does not write them - put the image in a user turn",
            )
            continue
        if content is not None:
            turns.append({"role": message["role"], "content": content.text})
            images.extend(image.source for image in content.images)
    return turns, images


def _generation(row: SourceRow, data: dict, turns, images, problem, bench) -> BenchmarkItem | None:
    """A generation row: the last assistant turn is the reference (for metric tool_call, its calls parsed)."""
    last = f"messages[{len(turns) - 1}]"
    if turns[-1]["role"] != "assistant":
        problem(
            "messages",
            f"no assistant turn at the end: a generation benchmark ({bench.metric}) needs the "
            "reference answer as the last assistant message (log-prob multiple choice uses options/answer_id "
            "with metric: logprob_mcq)",
        )
        return None
    if len(turns) < 2:
        problem("messages", "only an assistant turn: the prompt (everything before the reference) is empty")
        return None
    if not turns[-1]["content"].strip():
        problem(f"{last}.content", "the reference answer (the last assistant turn) is empty")
        return None
    if scored_reference(bench.metric, turns[-1]["content"]) == "":  # ("..." or "The": an empty answer would match)
        problem(f"{last}.content", _nothing_to_score(bench.metric, turns[-1]["content"]))
        return None
    tools = _tools(data, row, problem)
    reference_calls = None
    if bench.metric == "tool_call":
        blocks = find_tool_calls(turns[-1]["content"])
        if blocks.problem is not None:
            problem(
                last,
                f"the reference turn's tool call does not parse ({blocks.problem}); write it as "
                '<|tool_call_start|>[name(key=value)]<|tool_call_end|> or as tool_calls: [{"function": {"name": '
                '..., "arguments": {...}}}]',
            )
            return None
        reference_calls = blocks.calls
    return BenchmarkItem(
        row.file,
        row.location,
        turns[:-1],
        reference=turns[-1]["content"],
        images=images,
        tools=tools,
        reference_calls=reference_calls,
    )


def _nothing_to_score(metric: str, reference: str) -> str:
    consequence = (
        "an empty answer would score 1.0 on it"
        if metric == "exact_match"
        else "no answer can be scored against it (every answer would score 0)"
    )
    return (
        f"the reference answer {reference[:80]!r} is nothing once metric {metric} normalises it "
        f"({NORMALISATION[metric]}), so {consequence}; write the answer the model should give (a word, a number"
        + (", an option letter" if metric == "mcq_gen" else "; for option letters use metric mcq_gen")
        + "), or remove the row"
    )


def _with_calls_in_content(message: dict, field_name: str, problem) -> dict | None:
    """An assistant message's structured `tool_calls` (OpenAI's form) appended to its content in LFM notation, as
    training data is (data/tool_use.py): prompts and references then hold the calls as the model writes them."""
    if message.get("role") != "assistant" or message.get("tool_calls") is None:
        return message
    converted = convert_structured(message["tool_calls"], f"{field_name}.tool_calls", problem)
    if converted is None:
        return None
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        problem(f"{field_name}.content", "an assistant turn with tool_calls: expected text content (or none)")
        return None
    return {**message, "content": (content or "") + converted}


def _tools(data: dict, row, problem) -> list | None:
    """The row's `tools` column: a list of tool definitions (JSON schemas), or its JSON text."""
    tools = data.get("tools")
    if tools is None:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            problem("tools", f"expected a list of tool definitions or its JSON text ({err.msg})")
            return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        problem("tools", f"expected a list of tool definitions (JSON schema objects), got {describe_value(tools)}")
        return None
    return tools


def _mcq(row, data, turns, images, problem, bench) -> BenchmarkItem | None:
    options, answer = data.get("options"), data.get("answer_id")
    if row.from_text_table and isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError:
            problem("options", "expected JSON text holding a list of strings")
            return None
    if row.from_text_table and isinstance(answer, str) and answer.strip().lstrip("-").isdigit():
        answer = int(answer)
    if not isinstance(options, list) or len(options) < 2:
        problem(
            "options",
            f"expected a list of at least two options, got {describe_value(options)}"
            + (f" with {len(options)}" if isinstance(options, list) else ""),
        )
        return None
    for index, option in enumerate(options):
        if not isinstance(option, str) or not option.strip():
            problem(f"options[{index}]", f"expected a non-empty string, got {describe_value(option)}")
            return None
        if option in options[:index]:
            problem(
                f"options[{index}]",
                f"{option!r} is also options[{options.index(option)}]: two equal options "
                "score the same, so the question cannot be answered",
            )
            return None
    if isinstance(answer, bool) or not isinstance(answer, int):
        problem("answer_id", f"expected the index of the correct option (an integer), got {describe_value(answer)}")
        return None
    if not 0 <= answer < len(options):
        problem("answer_id", f"{answer} is out of range for {len(options)} options (0 to {len(options) - 1})")
        return None
    if turns[-1]["role"] == "assistant":
        problem(
            "messages",
            f"ends with an assistant turn: in a log-prob benchmark ({bench.metric}) the options are "
            "the assistant's reply, so the prompt must end with the user's question",
        )
        return None
    return BenchmarkItem(row.file, row.location, turns, options=options, answer_id=answer, images=images)


def episode_item(row, model_name: str, problems: list[RowProblem]) -> BenchmarkItem | None:
    """A benchmark row checked as a GRPO row (the same contract as GRPO data with an environment)."""
    from leap_finetune.data.grpo_rows import check_grpo_row
    from leap_finetune.models.registry import model_family

    checked, found, _ = check_grpo_row(row, family=model_family(model_name, model_name), environment_tools=[])
    if checked is None:
        problems.extend(found)
        return None
    if checked.solution is None:
        problems.append(
            RowProblem(row.file, row.location, "solution", "missing: an episode is scored by its final answer")
        )
        return None
    return BenchmarkItem(row.file, row.location, checked.prompt, reference=checked.solution, extra=checked.extra)
