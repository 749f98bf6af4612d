"""What each kind of row is (issue #46): the columns that mark it, its checker, its tokenizer, whether its
prepared rows spill to Arrow files, and what the data report and the run report say of it.

methods/ says which kind a training type reads (`Method.rows`); this table says what that kind is. The data step,
`validate`, the recipes and the reports ask the kind (`row_kind_of(resolved).spills`) instead of comparing it with
the kinds they know: a new type that reads an existing kind (a copy of SFT under another name) is answered here
without an entry of its own, and a new kind is one entry. Only this module (and methods/) compares row kinds
(tests/test_architecture.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from leap_finetune.data.chat_templates import render_family
from leap_finetune.data.grpo_rows import check_grpo_row, prepare_prompt
from leap_finetune.data.images import VisionRenderer, image_sizes, vision_rows
from leap_finetune.data.preference_rows import check_dpo_row, check_kto_row
from leap_finetune.data.preference_tokens import kto_balance_advice, tokenize_kto, tokenize_pair
from leap_finetune.data.render import tokenize_many
from leap_finetune.data.retrieval_rows import check_retrieval_row
from leap_finetune.data.sft_rows import check_sft_row
from leap_finetune.methods import CONVERSATION, LABELLED, METHODS, PAIR, PROMPT, TEXT_PAIR, method_of


def _nothing(*_) -> list:
    return []


def tokens_line(prepared) -> str:
    """The data report's first line for rows trained on token by token (and without a config to ask)."""
    return (
        f"data: {prepared.rows_read} rows read -> {len(prepared.train)} train, {len(prepared.eval)} eval; "
        f"{prepared.train_tokens:,} train tokens, {prepared.trained_tokens:,} carry loss"
    )


@dataclass(frozen=True)
class RowKind:
    kind: str  # the name methods/ gives it (`Method.rows`)
    # the columns that mark such rows (any one tuple of them): "these rows look like dpo data" is said once instead
    # of the same missing field in every row
    marks: tuple[tuple[str, ...], ...]
    checker: Callable  # (resolved) -> the row checker: SourceRow -> (parsed, problems, warnings)
    tokenize: Callable  # (renderer, parsed) -> the row in full (what `inspect` shows)
    # (renderer, [parsed]) -> the chunk's valid rows in one batch, compact (`tokenize` then gives the few rows
    # `inspect` shows in full); None: each row by `tokenize`
    tokenize_batch: Callable | None = None
    # the prepared rows go to Arrow files as they come (the large sets: memory stays bounded), not kept in memory
    # (columns that differ between chunks: GRPO's passed-through fields, retrieval's negatives)
    spills: bool = False
    pairs: bool = False  # two answers per row (chosen, rejected): an image run's collator batches both
    tool_calls: bool = False  # rows may call tools (dataset.hold_out_tools can hold them out)
    disguises_tools: bool = False  # dataset.augment_tools rewrites the rows' tools (data/tool_disguise.py)
    data_line: Callable = tokens_line  # (prepared) -> the data report's first line
    data_warnings: Callable = _nothing  # (prepared, resolved) -> warnings about the rows as a whole
    # (eval metrics after, before, the last training log) -> the run report's (name, value) rows of its own
    results: Callable = _nothing
    # (parsed) -> the row's turns as one conversation (messages with a role and content), its answer last: benchmark
    # rows that are training rows are found by them (evaluation/trained_rows.py); [] for rows that have none
    conversation: Callable = _nothing


# ---- checkers ------------------------------------------------------------------------------------------


def _family(resolved) -> str:
    return render_family(resolved.chat_template, resolved.model_family)


def _conversation_checker(resolved):
    from leap_finetune.data.chat_templates import renders_thinking

    return functools.partial(
        check_sft_row,
        needs_assistant=resolved.loss_on != "all",
        family=_family(resolved),
        takes_images=resolved.vision,
        thinking_dropped_by=resolved.chat_template if renders_thinking(resolved.chat_template) is False else None,
    )


def _pair_checker(resolved):
    return functools.partial(check_dpo_row, family=_family(resolved), takes_images=resolved.vision)


def _labelled_checker(resolved):
    return functools.partial(check_kto_row, family=_family(resolved))


def _prompt_checker(resolved):
    environment = getattr(resolved, "environment", None)  # (the checker serves validate's datasets too)
    tools = environment["schemas"] if environment else None
    return functools.partial(
        check_grpo_row,
        family=_family(resolved),
        environment_tools=tools,
        takes_images=bool(getattr(resolved, "vision", False)),
    )


def _text_pair_checker(resolved):
    return check_retrieval_row  # (no chat template: nothing to render)


# ---- tokenizers ----------------------------------------------------------------------------------------


def _conversation(renderer, parsed):
    if getattr(parsed, "images", None) and isinstance(renderer, VisionRenderer):
        return renderer.tokenize_images(parsed, image_sizes(renderer, parsed.images))[0]
    return renderer.tokenize(parsed.messages, parsed.tools)


def _conversations(renderer, conversations: list) -> list:
    if isinstance(renderer, VisionRenderer):
        return vision_rows(renderer, conversations)
    return tokenize_many(renderer, conversations)


def _pair(renderer, parsed):
    pair = tokenize_pair(renderer, parsed)
    if isinstance(renderer, VisionRenderer):  # every pair of an image run has the image columns
        renderer.expand_pair(pair, image_sizes(renderer, parsed.images) if parsed.images else [])
    return pair


def _text_pair(renderer, parsed):
    return renderer.encode(parsed)  # a RetrievalEncoder (data/retrieval_tokens.py)


# ---- the turns a row trains on (compared with benchmark rows) ------------------------------------------


def _messages(parsed) -> list:
    return parsed.messages


def _prompt_and_chosen(parsed) -> list:
    return parsed.prompt + parsed.chosen


def _prompt_and_completion(parsed) -> list:
    return parsed.prompt + parsed.completion


def _prompt_and_solution(parsed) -> list:
    return parsed.prompt + ([{"role": "assistant", "content": parsed.solution}] if parsed.solution else [])


# ---- what the reports say ------------------------------------------------------------------------------


def _prompts_line(prepared) -> str:
    with_solution = sum(1 for solution in prepared.train.column("solution") if solution)
    return (
        f"data: {prepared.rows_read} rows read -> {len(prepared.train)} train prompts "
        f"({with_solution} with a solution), {len(prepared.eval)} eval; {prepared.train_tokens:,} "
        "prompt tokens"
    )


def _text_pairs_line(prepared) -> str:
    return (
        f"data: {prepared.rows_read} rows read -> {len(prepared.train)} train, {len(prepared.eval)} eval "
        f"(query, positive, negatives); {prepared.train_tokens:,} train tokens"
    )


def _label_balance(prepared, resolved) -> list[str]:
    advice = kto_balance_advice(
        prepared.train.column("label"),
        resolved.training.get("desirable_weight", 1.0),
        resolved.training.get("undesirable_weight", 1.0),
    )
    return [advice] if advice else []


def _was(before: dict, key: str) -> str:
    return f"{before[key]:.3f} -> " if key in before else ""


def _pair_results(after: dict, before: dict, trained: dict) -> list[tuple[str, str]]:
    rows = []
    for name in ("accuracies", "margins"):
        key = f"eval_rewards/{name}"
        if key in after:
            rows.append((f"reward {name} (held out)", _was(before, key) + f"{after[key]:.3f}"))
        elif f"rewards/{name}" in trained:
            rows.append((f"reward {name} (last training log)", f"{trained[f'rewards/{name}']:.3f}"))
    return rows


def _labelled_results(after: dict, before: dict, trained: dict) -> list[tuple[str, str]]:
    def gap(values: dict, prefix: str):
        chosen, rejected = values.get(f"{prefix}rewards/chosen"), values.get(f"{prefix}rewards/rejected")
        return chosen - rejected if chosen is not None and rejected is not None else None

    held, start, last = gap(after, "eval_"), gap(before, "eval_"), gap(trained, "")
    if held is not None:
        return [
            (
                "reward gap, desirable - undesirable (held out)",
                (f"{start:.3f} -> " if start is not None else "") + f"{held:.3f}",
            )
        ]
    if last is not None:
        return [("reward gap, desirable - undesirable (last training log)", f"{last:.3f}")]
    return []


# ---- the table -----------------------------------------------------------------------------------------

ROW_KINDS: dict[str, RowKind] = {
    k.kind: k
    for k in (
        RowKind(
            CONVERSATION,
            marks=(("messages",), ("conversations",), ("conversation",), ("chat",)),
            checker=_conversation_checker,
            tokenize=_conversation,
            tokenize_batch=_conversations,
            spills=True,
            tool_calls=True,
            disguises_tools=True,
            conversation=_messages,
        ),
        RowKind(
            PAIR,
            marks=(("chosen", "rejected"),),
            checker=_pair_checker,
            tokenize=_pair,
            spills=True,
            pairs=True,
            results=_pair_results,
            conversation=_prompt_and_chosen,
        ),
        RowKind(
            LABELLED,
            marks=(("completion", "label"),),
            checker=_labelled_checker,
            tokenize=tokenize_kto,
            spills=True,
            data_warnings=_label_balance,
            results=_labelled_results,
            conversation=_prompt_and_completion,
        ),
        RowKind(
            PROMPT,
            marks=(("prompt", "solution"),),
            checker=_prompt_checker,
            tokenize=prepare_prompt,
            tool_calls=True,  # (a solution may be a tool call)
            data_line=_prompts_line,
            conversation=_prompt_and_solution,
        ),
        RowKind(
            TEXT_PAIR,
            marks=(("query", "positive"),),
            checker=_text_pair_checker,
            tokenize=_text_pair,
            data_line=_text_pairs_line,
        ),
    )
}

# (kind, columns) to look for, the shapes naming more columns first: two columns say more than one
ROW_SHAPES: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    sorted(((k.kind, columns) for k in ROW_KINDS.values() for columns in k.marks), key=lambda s: -len(s[1]))
)


def row_kind_of(of) -> RowKind:
    """The kind of row a training type reads: of its name, or of anything with a `training_type` (a config)."""
    return ROW_KINDS[method_of(of).rows]


def contract(resolved):
    """The checker of the rows the training type reads."""
    return row_kind_of(resolved).checker(resolved)


def other_types_for(columns: list[set], training_type: str) -> list[str]:
    """The training types whose kind of row these rows are (every row has the columns that mark it), when it is not
    the kind `training_type` reads; [] otherwise, and when no kind's columns are all there."""
    if not columns:
        return []
    for kind, needed in ROW_SHAPES:
        if all(set(needed) <= c for c in columns):
            if kind == method_of(training_type).rows:
                return []
            return [name for name, m in METHODS.items() if m.rows == kind]
    return []
