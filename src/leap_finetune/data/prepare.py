"""The data pipeline the driver runs before any model loads: read -> validate every row ->
split -> render + mask + tokenize -> report.

Nothing is dropped silently: invalid rows (with `on_invalid: skip`) and rows whose trained tokens
were all cut off by `max_length` are counted, listed, and saved by the driver.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.data.readers import SourceRow, read_dataset
from leap_finetune.data.render import Renderer, TokenizedRow
from leap_finetune.data.chat_templates import render_family
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
    train: list[TokenizedRow]
    eval: list[TokenizedRow]
    rows_read: int = 0
    dropped: list[DroppedRow] = field(default_factory=list)
    invalid_skipped: int = 0
    fully_truncated: int = 0
    partially_truncated: int = 0
    # messages of the first `samples` held-out rows (training rows when nothing is held out), for
    # the answers printed before and after training
    sample_messages: list[Conversation] = field(default_factory=list)
    warnings: list[RowWarning] = field(default_factory=list)

    @property
    def train_tokens(self) -> int:
        return sum(len(r.input_ids) for r in self.train)

    @property
    def trained_tokens(self) -> int:
        return sum(r.trained_tokens for r in self.train)


@dataclass
class _ValidRow:
    source: SourceRow
    conversation: Conversation


def validate_rows(
    path: str, resolved: ResolvedConfig, *, limit: int | None
) -> tuple[list[_ValidRow], list[RowProblem], list[RowWarning], int]:
    """Every row of one dataset source: (valid rows, problems, warnings, rows read)."""
    ds = resolved.dataset
    result = read_dataset(path, split=ds.split, subset=ds.subset, limit=limit)
    problems = list(result.problems)
    warnings: list[RowWarning] = []
    family = render_family(resolved.chat_template, resolved.model_family)
    valid = []
    for row in result.rows:
        conversation, row_problems, row_warnings = check_sft_row(
            row, needs_assistant=resolved.loss_on != "all", family=family
        )
        warnings.extend(row_warnings)
        if row_problems:
            problems.extend(row_problems)
        else:
            valid.append(_ValidRow(row, conversation))
    problems.sort(key=lambda p: (p.file, _position(p.location)))
    return valid, problems, warnings, len(result.rows) + len(result.problems)


def _position(location: str) -> int:
    digits = re.search(r"\d+", location)
    return int(digits.group()) if digits else 0


def prepare_sft_data(resolved: ResolvedConfig, tokenizer, renderer: Renderer) -> PreparedData:
    ds = resolved.dataset
    train_rows, problems, warnings, read = validate_rows(ds.path, resolved, limit=ds.limit)
    eval_rows: list[_ValidRow] = []
    if ds.val_path:
        eval_rows, eval_problems, eval_warnings, eval_read = validate_rows(ds.val_path, resolved, limit=None)
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

    prepared = PreparedData(train=[], eval=[], rows_read=read, dropped=dropped, invalid_skipped=invalid_skipped,
                            sample_messages=[r.conversation for r in (eval_rows or train_rows)[: resolved.samples]],
                            warnings=warnings)
    for split_rows, target in ((train_rows, prepared.train), (eval_rows, prepared.eval)):
        for row in split_rows:
            tokenized = renderer.tokenize(row.conversation.messages, row.conversation.tools)
            tokenized.meta = {"file": row.source.file, "location": row.source.location}
            if tokenized.trained_tokens == 0:
                prepared.fully_truncated += 1
                prepared.dropped.append(DroppedRow(
                    row.source.file, row.source.location,
                    f"every trained token is beyond max_length={renderer.max_length} "
                    f"({len(tokenizer(tokenized.text, add_special_tokens=False)['input_ids'])} tokens)",
                ))
                continue
            if tokenized.trained_tokens_lost:
                prepared.partially_truncated += 1
            target.append(tokenized)
    if not prepared.train:
        raise LeapError(
            "no training rows are left after validation and truncation",
            where=ds.path,
            fix="check the dropped rows listed above; raise training_config.max_length if rows were truncated",
        )
    return prepared


def _split(rows: list[_ValidRow], test_size: float, seed: int) -> tuple[list[_ValidRow], list[_ValidRow]]:
    count = int(test_size) if test_size >= 1 else max(1, round(len(rows) * test_size))
    if count >= len(rows):
        raise LeapError(
            f"dataset.test_size asks for {count} evaluation rows but there are only {len(rows)} valid rows",
            where="dataset.test_size",
            fix="use a smaller test_size, or a separate val_path",
        )
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    held_out = set(order[:count])
    return ([r for i, r in enumerate(rows) if i not in held_out], [r for i, r in enumerate(rows) if i in held_out])
