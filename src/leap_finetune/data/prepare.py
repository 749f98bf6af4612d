"""The data pipeline the driver runs before any model loads: read -> validate every row ->
split -> render + mask + tokenize -> report.

Nothing is dropped silently: invalid rows (with `on_invalid: skip`) and rows whose trained tokens
were all cut off by `max_length` are counted, listed, and saved by the driver.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.data.chat_templates import render_family
from leap_finetune.data.grpo_rows import check_grpo_row, column_kind_problems, prepare_prompt
from leap_finetune.data.preference_rows import check_dpo_row, check_kto_row
from leap_finetune.data.preference_tokens import tokenize_kto, tokenize_pair
from leap_finetune.data.readers import SUFFIXES, SourceRow, read_dataset
from leap_finetune.data.render import Renderer
from leap_finetune.data.retrieval_rows import check_retrieval_row
from leap_finetune.data.sft_rows import Conversation, RowWarning, check_sft_row
from leap_finetune.errors import DataError, LeapError, RowProblem


@dataclass
class DroppedRow:
    file: str
    location: str
    reason: str

    def to_json(self) -> dict:
        return {"file": self.file, "location": self.location, "reason": self.reason}


@dataclass
class PreparedData:
    """Tokenized rows (TokenizedRow for SFT, TokenizedPair for DPO, TokenizedKto for KTO): each has
    `.columns()` (what the trainer reads), `.inspect()`, `.meta`, `.tokens`, `.trained_tokens`."""

    train: list
    eval: list
    rows_read: int = 0
    dropped: list[DroppedRow] = field(default_factory=list)
    invalid_skipped: int = 0
    fully_truncated: int = 0
    partially_truncated: int = 0
    # conversations of the first `samples` held-out rows (training rows when nothing is held out), for
    # the answers printed before and after training
    sample_messages: list[Conversation] = field(default_factory=list)
    warnings: list[RowWarning] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # about the data as a whole (skipped folder entries, ...)

    @property
    def train_tokens(self) -> int:
        return sum(r.tokens for r in self.train)

    @property
    def trained_tokens(self) -> int:
        return sum(r.trained_tokens for r in self.train)


@dataclass
class _ValidRow:
    source: SourceRow
    parsed: object  # Conversation, PreferenceRow or KtoRow


RETRIEVAL = ("embedding", "colbert")


def _contract(resolved: ResolvedConfig):
    if resolved.training_type in RETRIEVAL:
        return check_retrieval_row
    family = render_family(resolved.chat_template, resolved.model_family)
    if resolved.training_type == "sft":
        return functools.partial(check_sft_row, needs_assistant=resolved.loss_on != "all", family=family)
    return functools.partial({"dpo": check_dpo_row, "kto": check_kto_row, "grpo": check_grpo_row}[resolved.training_type],
                             family=family)


def _tokenize(resolved: ResolvedConfig, renderer: Renderer, parsed):
    if resolved.training_type in RETRIEVAL:
        return renderer.encode(parsed)  # a RetrievalEncoder (data/retrieval_tokens.py)
    if resolved.training_type == "sft":
        return renderer.tokenize(parsed.messages, parsed.tools)
    if resolved.training_type == "dpo":
        return tokenize_pair(renderer, parsed)
    if resolved.training_type == "grpo":
        return prepare_prompt(renderer, parsed)
    return tokenize_kto(renderer, parsed)


# The columns that identify each training type's rows (to say "these are DPO rows" instead of listing
# the same missing field in every row).
ROW_SHAPES = (
    ("dpo", ("chosen", "rejected")),
    ("kto", ("completion", "label")),
    ("grpo", ("prompt", "solution")),
    ("embedding or colbert", ("query", "positive")),
    ("sft", ("messages",)), ("sft", ("conversations",)), ("sft", ("conversation",)), ("sft", ("chat",)),
)


def validate_rows(
    path: str, resolved: ResolvedConfig, *, limit: int | None, notices: list[str] | None = None
) -> tuple[list[_ValidRow], list[RowProblem], list[RowWarning], int]:
    """Every row of one dataset source: (valid rows, problems, warnings, rows read)."""
    ds = resolved.dataset
    key = "dataset.val_path" if path == ds.val_path else "dataset.path"
    result = read_dataset(path, split=ds.split, subset=ds.subset, limit=limit, key=key)
    if result.skipped and notices is not None:
        notices.append(f"{path}: not read (sub-folders and files that are not {', '.join(SUFFIXES)}): "
                       + ", ".join(result.skipped[:10]) + (f" and {len(result.skipped) - 10} more" if len(result.skipped) > 10 else ""))
    problems = list(result.problems)
    warnings: list[RowWarning] = []
    check = _contract(resolved)
    valid = []
    for row in result.rows:
        parsed, row_problems, row_warnings = check(row)
        warnings.extend(row_warnings)
        if row_problems:
            problems.extend(row_problems)
        else:
            valid.append(_ValidRow(row, parsed))
    if resolved.training_type == "grpo":
        problems.extend(column_kind_problems([(v.source, v.parsed.extra) for v in valid]))
    if problems and len(valid) < len(result.rows) / 2:
        _check_row_shape(result.rows, resolved, path)
    problems.sort(key=lambda p: (p.file, _position(p.location)))
    return valid, problems, warnings, len(result.rows) + len(result.problems)


def _check_row_shape(rows: list[SourceRow], resolved: ResolvedConfig, path: str) -> None:
    """Most rows invalid, and they have the columns of another training type: say that, once."""
    columns = [set(row.data) for row in rows[:50] if isinstance(row.data, dict)]
    if not columns:
        return
    for kind, needed in ROW_SHAPES:
        if all(set(needed) <= c for c in columns):
            if resolved.training_type in kind.split(" or "):
                return
            found = ", ".join(sorted(columns[0]))
            first = kind.split(" or ")[0]
            raise LeapError(
                f"these rows look like {kind} data (columns: {found}), but training_type is {resolved.training_type}",
                where=path,
                fix=f"set training_type: {first} to train on them (see README for the {resolved.training_type} row "
                "format), or point dataset.path at other data",
            )


def _position(location: str) -> int:
    digits = re.search(r"\d+", location)
    return int(digits.group()) if digits else 0


def prepare_data(resolved: ResolvedConfig, tokenizer, renderer: Renderer) -> PreparedData:
    ds = resolved.dataset
    notices: list[str] = []
    train_rows, problems, warnings, read = validate_rows(ds.path, resolved, limit=ds.limit, notices=notices)
    eval_rows: list[_ValidRow] = []
    if ds.val_path:
        eval_rows, eval_problems, eval_warnings, eval_read = validate_rows(ds.val_path, resolved, limit=None,
                                                                           notices=notices)
        problems += eval_problems
        warnings += eval_warnings
        read += eval_read
    dropped: list[DroppedRow] = []
    if problems:
        if ds.on_invalid == "error":
            raise DataError(problems=problems, total_rows=read)
        seen = set()
        for p in problems:
            key = (p.file, p.location)
            reason = f"{p.field}: {p.problem}"
            if key in seen:
                dropped[-1].reason += "; " + reason
            else:
                seen.add(key)
                dropped.append(DroppedRow(p.file, p.location, reason))
    invalid_skipped = len(dropped)

    if not ds.val_path and ds.test_size:
        train_rows, eval_rows = _split(train_rows, ds.test_size, resolved.training.get("seed", 42))

    samples = [r.parsed for r in (eval_rows or train_rows)[: resolved.samples] if isinstance(r.parsed, Conversation)]
    prepared = PreparedData(train=[], eval=[], rows_read=read, dropped=dropped, invalid_skipped=invalid_skipped,
                            sample_messages=samples, warnings=warnings, notices=notices)
    for split_rows, target in ((train_rows, prepared.train), (eval_rows, prepared.eval)):
        for row in split_rows:
            tokenized = _tokenize(resolved, renderer, row.parsed)
            tokenized.meta = {"file": row.source.file, "location": row.source.location}
            if tokenized.trained_tokens == 0:
                prepared.fully_truncated += 1
                prepared.dropped.append(DroppedRow(
                    row.source.file, row.source.location,
                    f"every trained token is beyond max_length={renderer.max_length} ({tokenized.tokens} tokens)",
                ))
                continue
            if _partially_truncated(tokenized):
                prepared.partially_truncated += 1
            target.append(tokenized)
    if not prepared.train:
        examples = "; ".join(f"{r.location}: {r.reason}" for r in prepared.dropped[:3])
        raise LeapError(
            f"no training rows are left: {read} row(s) read, {prepared.invalid_skipped} invalid and skipped "
            f"(dataset.on_invalid: skip), {prepared.fully_truncated} with every trained token beyond max_length"
            + (f"; e.g. {examples}" if examples else ""),
            where=ds.path,
            fix="set dataset.on_invalid: error to see every problem" if prepared.invalid_skipped
            else "raise training_config.max_length",
        )
    if resolved.training_type == "kto":
        _check_kto_batches(prepared, resolved)
    if resolved.training_type in RETRIEVAL:
        _same_negatives(prepared)
    return prepared


def _same_negatives(prepared: PreparedData) -> None:
    """The loss reads (query, positive, negative_1..k) with the same k in every row: k is the fewest hard
    negatives a training row has; when rows have more, the report says how many are not used."""
    counts = [len(r.negatives) for r in prepared.train]
    used = min(counts)
    for row in prepared.train + prepared.eval:
        row.negatives_used = used
    unused = sum(c - used for c in counts)
    if unused:
        prepared.notices.append(
            f"retrieval: every training row uses {used} hard negative(s), the fewest a row has ({min(counts)}-"
            f"{max(counts)} per row): {unused} negative(s) are not trained on; give every row the same number to use "
            "them all (the other rows' documents are negatives too: in-batch)")


def _check_kto_batches(prepared: PreparedData, resolved: ResolvedConfig) -> None:
    """KTO's KL term pairs each prompt with another completion of its batch (recipes/kto.py): a split
    of one row cannot, and a last batch of one row borrows the completion of the row before it."""
    for split, rows, key in (("train", prepared.train, "per_device_train_batch_size"),
                             ("eval", prepared.eval, "per_device_eval_batch_size")):
        size = resolved.training.get(key, 8)
        if len(rows) == 1:
            raise LeapError(f"the {split} split has 1 row: KTO's KL term pairs each prompt with another row's "
                            "completion, so it needs at least 2", where=resolved.dataset.val_path or resolved.dataset.path,
                            fix="add rows" + (", or a larger dataset.test_size" if split == "eval" else ""))
        if len(rows) > 1 and len(rows) % size == 1:
            prepared.notices.append(
                f"KTO: the last {split} batch holds 1 row ({len(rows)} rows, {key} {size}); its KL term uses the "
                "completion of the row before it, from the previous batch")


def _partially_truncated(tokenized) -> bool:
    lost = getattr(tokenized, "trained_tokens_lost", None)
    return bool(lost) if lost is not None else tokenized.truncated


def _split(rows: list[_ValidRow], test_size: float, seed: int) -> tuple[list[_ValidRow], list[_ValidRow]]:
    count = int(test_size) if test_size >= 1 else max(1, round(len(rows) * test_size))
    if count >= len(rows):
        raise LeapError(
            f"dataset.test_size asks for {count} evaluation rows, but the dataset has {len(rows)} valid rows "
            "(at least one must be left to train on)",
            where=rows[0].source.file if rows else "dataset",
            fix="use a smaller test_size, or a separate val_path",
        )
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held_out = set(order[:count])
    return ([r for i, r in enumerate(rows) if i not in held_out], [r for i, r in enumerate(rows) if i in held_out])
