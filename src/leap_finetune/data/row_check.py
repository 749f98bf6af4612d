"""Pass 1 of the data step (data/prepare.py): the file sets it reads (each source's `path`, and its `val_path`),
every row of them checked chunk by chunk on every core, every problem listed before anything is tokenized, and
the rows held out for evaluation chosen."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.schema_dataset import DatasetConfig
from leap_finetune.data.chunks import CheckedChunk, check_chunk, chunked
from leap_finetune.data.grpo_rows import column_kind_problems
from leap_finetune.data.held_out_tools import held_out_names
from leap_finetune.data.mixing import held_out_mask
from leap_finetune.data.prepared import DroppedRow, SourceReport, dataset_items
from leap_finetune.data.readers import SUFFIXES, Source
from leap_finetune.data.row_kinds import other_types_for
from leap_finetune.data.sft_rows import RowWarning
from leap_finetune.errors import DataError, LeapError, RowProblem
from leap_finetune.methods import method_of


@dataclass
class Stream:
    """One file set read by the data step: a source's `path` (training rows, maybe split) or its `val_path`."""

    item: int
    source: Source
    held_out: bool  # every valid row is an evaluation row (val_path)
    chunks: list[CheckedChunk] = field(default_factory=list)
    skip: set = field(default_factory=set)  # (file, location): valid rows the column-kind check rejected, or held out
    tool_held: int = 0  # valid rows that name a held-out tool (in `skip`)
    problems: list[RowProblem] = field(default_factory=list)
    eval_mask: np.ndarray | None = None  # per valid row: held out for evaluation

    @property
    def valid(self) -> int:
        return sum(c.valid for c in self.chunks) - len(self.skip)

    @property
    def row_count(self) -> int:
        return sum(c.row_count for c in self.chunks)


def streams_of(items: list[DatasetConfig]) -> tuple[list[Stream], list[str]]:
    """Each source's file sets (`path`, and `val_path`), and notices about what in them is not read."""
    notices: list[str] = []
    streams = []
    for index, item in enumerate(items):
        key = "dataset.path" if len(items) == 1 else f"dataset[{index}].path"
        source = Source(
            item.path, split=item.split, subset=item.subset, limit=item.limit, key=key, image_root=item.image_root
        )
        streams.append(Stream(index, source, held_out=False))
        held = folder_eval_split(item, source)
        if held:  # (a folder in the Hub's layout: its validation or test files are the evaluation rows)
            val = Source(item.path, split=held, limit=None, key=key, image_root=item.image_root)
            streams.append(Stream(index, val, held_out=True))
        if source.splits:
            notices.append(_split_notice(item, source, held))
        if source.mixed:
            notices.append(source.mixed)
        if item.val_path:
            val = Source(
                item.val_path,
                split=item.split,
                subset=item.subset,
                limit=None,
                key=key.replace("path", "val_path"),
                image_root=item.image_root,
            )
            streams.append(Stream(index, val, held_out=True))
    for stream in streams:
        skipped = stream.source.skipped
        if skipped:
            notices.append(
                f"{stream.source.path}: not read (sub-folders and files that are not {', '.join(SUFFIXES)}): "
                + ", ".join(skipped[:10])
                + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
            )
    return streams, notices


def folder_eval_split(item: DatasetConfig, source: Source) -> str | None:
    """The split of a Hub-layout folder held out for evaluation: validation, else test - unless val_path or test_size
    says where the evaluation rows come from, or that split is the one trained on."""
    from leap_finetune.data.splits import eval_split

    if not source.splits or item.val_path or item.test_size:
        return None
    held = eval_split({s: f for s, f in source.splits.items() if s != source.split})
    return held


def _split_notice(item: DatasetConfig, source: Source, held: str | None) -> str:
    """What the data report says of a Hub-layout folder: which split's files train, which evaluate, which are not
    read (and why)."""

    def files(split: str) -> str:
        names = [str(p.relative_to(item.path)) for p in source.splits[split]]
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    said = [f"{source.split} ({files(source.split)}) for training"]
    if held:
        said.append(f"{held} ({files(held)}) held out for evaluation")
    why = "val_path is the evaluation data" if item.val_path else "test_size holds out training rows instead"
    for split in source.splits:
        if split not in (source.split, held):
            if item.val_path or item.test_size:
                reason = why
            elif held:
                reason = f"the evaluation split is {held}"
            else:  # (`split: test` trains on the test files: nothing named test or validation is left to hold out)
                reason = f"split: {source.split} names the training files, and no test or validation split is left"
            said.append(f"{split} ({files(split)}) not read: {reason}")
    return f"{item.path}: files named by split, read as datasets reads a folder: " + "; ".join(said)


def source_reports(
    items: list[DatasetConfig], streams: list[Stream], train_rows: list[int], eval_rows: list[int]
) -> list[SourceReport]:
    def count(i: int, held_out: bool, what: str) -> int:
        return sum(getattr(s, what) for s in streams if s.item == i and s.held_out == held_out)

    return [
        SourceReport(
            item.path,
            rows_read=count(i, False, "row_count"),
            valid=count(i, False, "valid"),
            train_rows=train_rows[i],
            eval_rows=eval_rows[i],
            val_path=item.val_path or "",
            val_rows_read=count(i, True, "row_count"),
            val_valid=count(i, True, "valid"),
        )
        for i, item in enumerate(items)
    ]


def check_every_row(
    resolved: ResolvedConfig, items: list[DatasetConfig], streams: list[Stream], workers, progress
) -> tuple[int, list[DroppedRow], Warnings]:
    """Pass 1: every row checked; every problem listed before anything is tokenized. Returns the rows read, the
    invalid rows skipped (on_invalid: skip) and the warnings."""
    warnings = Warnings()
    for stream in streams:
        progress.start(f"checking {_short(stream.source.path)}", stream.source.limit)
        for checked in workers.map(check_chunk, chunked(stream.source.rows())):
            warnings.add(checked.warnings)
            checked.warnings = []
            stream.chunks.append(checked)
            progress.advance(checked.row_count)
        _after_check(stream, resolved)
    read = sum(s.row_count for s in streams)
    problems = [p for s in streams if items[s.item].on_invalid == "error" for p in s.problems]
    if problems:
        raise DataError(problems=problems, total_rows=read)
    for stream in streams:
        if not stream.row_count:
            raise LeapError(
                "the dataset has no rows", where=stream.source.path, fix="add rows, or check dataset.path / split"
            )
    return read, _dropped([p for s in streams for p in s.problems]), warnings


class Warnings:
    """Every row's warnings counted per kind (rows, not warnings), the first 20 of each kind kept: a warning on
    each of 1M rows is 1M objects otherwise. A row's warnings arrive together, so rows are counted as
    changes of (file, location)."""

    KEPT = 20

    def __init__(self):
        self.kept: list[RowWarning] = []
        self.rows: dict[str, int] = {}
        self.last: dict[str, tuple[str, str]] = {}
        self.count: dict[str, int] = {}

    def add(self, warnings: list[RowWarning]) -> None:
        for warning in warnings:
            key = (warning.file, warning.location)
            if self.last.get(warning.kind) != key:
                self.last[warning.kind] = key
                self.rows[warning.kind] = self.rows.get(warning.kind, 0) + 1
            if self.count.get(warning.kind, 0) < self.KEPT:
                self.count[warning.kind] = self.count.get(warning.kind, 0) + 1
                self.kept.append(warning)


def _short(path: str) -> str:
    return path if len(path) <= 50 else "..." + path[-47:]


def estimate_rows(source: Source) -> int:
    if source.limit is not None:
        return source.limit
    if source.hub is not None:
        return len(source.hub)
    return sum(f.stat().st_size for f in source.files) // 1500  # a chat row is ~1-3 KB


def _after_check(stream: Stream, resolved: ResolvedConfig) -> None:
    """The stream's problems in file order; GRPO's column kinds across rows; another training type's rows."""
    for checked in stream.chunks:
        stream.problems.extend(checked.problems)
    held_out = held_out_names(dataset_items(resolved))
    if held_out:
        held = {
            (file, location) for c in stream.chunks for file, location, names in c.tool_rows if held_out & set(names)
        }
        stream.skip |= held
        stream.tool_held = len(held)
    if method_of(resolved).rewards:
        for problem in column_kind_problems(k for c in stream.chunks for k in c.extra_kinds):
            stream.skip.add((problem.file, problem.location))
            stream.problems.append(problem)
    valid = stream.valid
    if stream.problems and valid < stream.row_count / 2:
        _check_row_shape([c for chunk in stream.chunks for c in chunk.columns_seen][:50], resolved, stream.source.path)
    stream.problems.sort(key=lambda p: (p.file, _position(p.location)))


def _dropped(problems: list[RowProblem]) -> list[DroppedRow]:
    """One dropped row per (file, location), its problems joined."""
    rows: dict[tuple[str, str], DroppedRow] = {}
    for p in problems:
        reason = f"{p.field}: {p.problem}"
        row = rows.get((p.file, p.location))
        if row is None:
            rows[(p.file, p.location)] = DroppedRow(p.file, p.location, reason)
        else:
            row.reason += "; " + reason
    return list(rows.values())


def choose_held_out(streams: list[Stream], items: list[DatasetConfig], seed: int) -> None:
    for stream in streams:
        item = items[stream.item]
        if stream.held_out:
            stream.eval_mask = np.ones(stream.valid, dtype=bool)
        elif not item.val_path and item.test_size:
            stream.eval_mask = held_out_mask(stream.valid, item.test_size, seed, stream.source.path)


def _check_row_shape(columns: list[set], resolved: ResolvedConfig, path: str) -> None:
    """Most rows invalid, and they have the columns of another training type: say that, once."""
    types = other_types_for(columns, resolved.training_type)
    if types:
        kind, first = " or ".join(types), types[0]
        found = ", ".join(sorted(columns[0]))
        raise LeapError(
            f"these rows look like {kind} data (columns: {found}), but training_type is {resolved.training_type}",
            where=path,
            fix=f"set training_type: {first} to train on them (see docs/data.md for the {resolved.training_type} row "
            "format), or point dataset.path at other data",
        )


def _position(location: str) -> int:
    digits = re.search(r"\d+", location)
    return int(digits.group()) if digits else 0
