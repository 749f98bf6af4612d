"""The data pipeline the driver runs before any model loads: read -> validate every row -> split ->
render + mask + tokenize -> mix -> report, cached on disk (data/cache.py).

Two passes over each source, chunk by chunk, on every core (data/chunks.py): the first checks every row
(so every problem is listed before anything is tokenized, as `validate` promises), the second tokenizes
the valid rows into Arrow tables. Only the current chunks are in memory as Python objects.

Nothing is dropped silently: invalid rows (with `on_invalid: skip`) and rows whose trained tokens
were all cut off by `max_length` are counted, listed, and saved by the driver.
"""

from __future__ import annotations

import itertools
import re
import shutil
import time
from dataclasses import dataclass, field

import numpy as np

from leap_finetune import faults
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.schema_dataset import DatasetConfig
from leap_finetune.data.chunks import (
    CheckedChunk,
    Job,
    TokenizeRequest,
    Workers,
    check_chunk,
    chunked,
    dataset_list,
    processes_for,
    tokenize_chunk,
)
from leap_finetune.data.grpo_rows import column_kind_problems
from leap_finetune.data.held_out_tools import check_hold_out, held_out_names, tool_split_of
from leap_finetune.data.mixing import held_out_mask, mix
from leap_finetune.data.progress import Progress
from leap_finetune.data.readers import SUFFIXES, Source
from leap_finetune.data.sft_rows import Conversation, RowWarning
from leap_finetune.data.table import RowTable, SplitWriter
from leap_finetune.errors import DataError, LeapError, RowProblem
from leap_finetune.files import is_disk_full
from leap_finetune.methods import CONVERSATION, LABELLED, METHODS, PAIR, PROMPT, TEXT_PAIR, method_of


@dataclass
class DroppedRow:
    file: str
    location: str
    reason: str

    def to_json(self) -> dict:
        return {"file": self.file, "location": self.location, "reason": self.reason}


@dataclass
class SourceReport:
    """One entry of `dataset:` in the data report."""

    path: str
    rows_read: int = 0  # of `path` (the held-out file's rows are counted apart)
    valid: int = 0
    train_rows: int = 0  # after truncation, before mixing
    eval_rows: int = 0  # held out: part of `path` (test_size), or the rows of `val_path`
    val_path: str = ""
    val_rows_read: int = 0
    val_valid: int = 0
    used_rows: int = 0  # training rows per epoch after `weight` / `epochs`
    train_tokens: int = 0  # of the used rows
    mixing: str = ""  # "weight 0.3", "epochs 2", or ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class PreparedData:
    """The prepared splits as Arrow tables (RowTable: `.table`, `.tokens`, `.trained_tokens`, `.examples`)."""

    train: RowTable
    eval: RowTable
    rows_read: int = 0
    dropped: list[DroppedRow] = field(default_factory=list)
    invalid_skipped: int = 0
    fully_truncated: int = 0
    partially_truncated: int = 0
    # conversations of the first `samples` held-out rows (training rows when nothing is held out), for
    # the answers printed before and after training
    sample_messages: list[Conversation] = field(default_factory=list)
    warnings: list[RowWarning] = field(default_factory=list)  # the first 20 of each kind
    warning_rows: dict[str, int] = field(default_factory=dict)  # rows with each kind of warning
    notices: list[str] = field(default_factory=list)  # about the data as a whole (skipped folder entries, ...)
    sources: list[SourceReport] = field(default_factory=list)
    # dataset.hold_out_tools: rows per split of each tool the rows name ({tool: {"train", "eval", "held_out"}}),
    # and the `unseen_tools` benchmark's rows (data/held_out_tools.py)
    tool_split: dict[str, dict[str, int]] = field(default_factory=dict)
    unseen_tool_rows: list[dict] = field(default_factory=list)
    tool_held_rows: int = 0  # rows left out for naming a held-out tool
    from_cache: str | None = None  # the cache entry these were read from (None: prepared now)
    seconds: float = 0.0  # preparation time (0 when read from the cache)
    tokenized: bool = True  # False: counted without a tokenizer (count_rows): no tokens, no max_length cuts

    @property
    def train_tokens(self) -> int:
        return self.train.tokens

    @property
    def trained_tokens(self) -> int:
        return self.train.trained_tokens


def dataset_items(resolved: ResolvedConfig) -> list[DatasetConfig]:
    """`dataset:` as a list of sources (one entry when it is a single mapping)."""
    ds = resolved.dataset
    return list(ds) if isinstance(ds, list) else [ds]


# The columns that mark each row kind (to say "these are DPO rows" instead of listing the same missing field in
# every row; the kind's training types are named from methods/)
ROW_SHAPES = (
    (PAIR, ("chosen", "rejected")),
    (LABELLED, ("completion", "label")),
    (PROMPT, ("prompt", "solution")),
    (TEXT_PAIR, ("query", "positive")),
    (CONVERSATION, ("messages",)),
    (CONVERSATION, ("conversations",)),
    (CONVERSATION, ("conversation",)),
    (CONVERSATION, ("chat",)),
)


@dataclass
class _Stream:
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
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)


def prepare_data(
    resolved: ResolvedConfig, tokenizer, renderer, *, console=None, examples: int = 5, use_cache: bool = True
) -> PreparedData:
    from leap_finetune.data import cache

    items = dataset_items(resolved)
    streams, notices = _streams(items)
    entry = (
        cache.entry_for(resolved, tokenizer, renderer, [s.source for s in streams], examples)
        if use_cache and all(item.cache for item in items)
        else None
    )
    prepared = cache.load(entry, console) if entry is not None else None
    if prepared is None:
        folder = cache.working_folder(entry)
        try:
            prepared = _prepare_now(resolved, renderer, items, streams, notices, console, examples, folder)
        except BaseException as err:
            shutil.rmtree(folder, ignore_errors=True)
            if entry is None or not is_disk_full(err):
                raise
            # The cache is optional: its disk is full, so the rows are prepared again in a temporary folder.
            if console is not None:
                console.print(
                    f"[yellow]note: the data cache's disk is full ({entry.folder.parent}): preparing without "
                    "the cache (free space there, or set LEAP_FINETUNE_CACHE to another folder)[/yellow]"
                )
            entry = None
            folder = cache.working_folder(None)
            streams = [_Stream(s.item, s.source, s.held_out) for s in streams]  # (read again from the start)
            try:
                prepared = _prepare_now(resolved, renderer, items, streams, notices, console, examples, folder)
            except BaseException as again:
                shutil.rmtree(folder, ignore_errors=True)
                again.__context__ = None  # (the cache's full disk is not this error's cause)
                if is_disk_full(again):
                    raise LeapError(
                        f"the disk is full: the prepared rows do not fit in {folder.parent}",
                        where="dataset",
                        fix="free space there, or set TMPDIR (and LEAP_FINETUNE_CACHE) to a folder on a "
                        "disk with space",
                    ) from None
                raise
        if entry is not None:
            cache.store(entry, prepared, folder, console)
    if method_of(resolved).kl_pairs:  # (depends on batch sizes, not on the data: after the cache)
        _check_kto_batches(prepared, resolved)
    return prepared


def _streams(items: list[DatasetConfig]) -> tuple[list[_Stream], list[str]]:
    """Each source's file sets (`path`, and `val_path`), and notices about what in them is not read."""
    notices: list[str] = []
    streams = []
    for index, item in enumerate(items):
        key = "dataset.path" if len(items) == 1 else f"dataset[{index}].path"
        source = Source(
            item.path, split=item.split, subset=item.subset, limit=item.limit, key=key, image_root=item.image_root
        )
        streams.append(_Stream(index, source, held_out=False))
        if item.val_path:
            val = Source(
                item.val_path,
                split=item.split,
                subset=item.subset,
                limit=None,
                key=key.replace("path", "val_path"),
                image_root=item.image_root,
            )
            streams.append(_Stream(index, val, held_out=True))
    for stream in streams:
        skipped = stream.source.skipped
        if skipped:
            notices.append(
                f"{stream.source.path}: not read (sub-folders and files that are not {', '.join(SUFFIXES)}): "
                + ", ".join(skipped[:10])
                + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
            )
    return streams, notices


def count_rows(resolved: ResolvedConfig, *, console=None) -> PreparedData:
    """Every row checked as `prepare_data` checks it, split and mixed, without a tokenizer: what `plan` does
    where the model's tokenizer is not at hand. Its tables hold row positions, not tokens (`tokenized` is
    False): no token counts, and rows that max_length would cut away entirely are still counted."""
    import tempfile
    from pathlib import Path

    import pyarrow as pa

    items = dataset_items(resolved)
    streams, notices = _streams(items)
    requested = max((item.num_proc for item in items if item.num_proc is not None), default=None)
    estimate = sum(_estimate_rows(s.source) for s in streams)
    with (
        Workers(Job(resolved, None), processes_for(requested, estimate)) as workers,
        Progress(console, workers.processes) as progress,
    ):
        read, dropped, warnings = _check_every_row(resolved, items, streams, workers, progress)
    check_hold_out(streams, items)
    _choose_held_out(streams, items, resolved.training.get("seed", 42))
    tool_split, unseen = tool_split_of(streams, items)
    train_rows, eval_rows = [0] * len(items), [0] * len(items)
    for stream in streams:
        held = int(stream.eval_mask.sum()) if stream.eval_mask is not None else 0
        train_rows[stream.item] += stream.valid - held
        eval_rows[stream.item] += held
    reports = _source_reports(items, streams, train_rows, eval_rows)

    def positions(count: int) -> RowTable:
        return RowTable(pa.table({"row": np.arange(count)}), np.zeros(count, np.int64), np.zeros(count, np.int64))

    with tempfile.TemporaryDirectory(prefix="leap-count-") as folder:  # (mix writes only tables it was given on disk)
        train = mix(
            positions(sum(train_rows)), items, reports, resolved.training.get("seed", 42), Path(folder) / "train.arrow"
        )
    prepared = PreparedData(
        train=train,
        eval=positions(sum(eval_rows)),
        rows_read=read,
        dropped=dropped,
        invalid_skipped=len(dropped),
        warnings=warnings.kept,
        warning_rows=warnings.rows,
        notices=notices,
        sources=reports,
        tool_split=tool_split,
        unseen_tool_rows=unseen,
        tool_held_rows=sum(s.tool_held for s in streams),
        tokenized=False,
    )
    _check_left(prepared, items)
    if method_of(resolved).kl_pairs:
        _check_kto_batches(prepared, resolved)
    return prepared


def _source_reports(
    items: list[DatasetConfig], streams: list[_Stream], train_rows: list[int], eval_rows: list[int]
) -> list[SourceReport]:
    def count(i: int, held_out: bool, what: str) -> int:
        return sum(getattr(s, what) for s in streams if s.item == i and s.held_out == held_out)

    return [
        SourceReport(
            item.path,
            rows_read=count(i, False, "rows"),
            valid=count(i, False, "valid"),
            train_rows=train_rows[i],
            eval_rows=eval_rows[i],
            val_path=item.val_path or "",
            val_rows_read=count(i, True, "rows"),
            val_valid=count(i, True, "valid"),
        )
        for i, item in enumerate(items)
    ]


def _check_every_row(
    resolved: ResolvedConfig, items: list[DatasetConfig], streams: list[_Stream], workers, progress
) -> tuple[int, list[DroppedRow], _Warnings]:
    """Pass 1: every row checked; every problem listed before anything is tokenized. Returns the rows read, the
    invalid rows skipped (on_invalid: skip) and the warnings."""
    warnings = _Warnings()
    for stream in streams:
        progress.start(f"checking {_short(stream.source.path)}", stream.source.limit)
        for checked in workers.map(check_chunk, chunked(stream.source.rows())):
            warnings.add(checked.warnings)
            checked.warnings = []
            stream.chunks.append(checked)
            progress.advance(checked.rows)
        _after_check(stream, resolved)
    read = sum(s.rows for s in streams)
    problems = [p for s in streams if items[s.item].on_invalid == "error" for p in s.problems]
    if problems:
        raise DataError(problems=problems, total_rows=read)
    for stream in streams:
        if not stream.rows:
            raise LeapError(
                "the dataset has no rows", where=stream.source.path, fix="add rows, or check dataset.path / split"
            )
    return read, _dropped([p for s in streams for p in s.problems]), warnings


def _prepare_now(
    resolved: ResolvedConfig,
    renderer,
    items: list[DatasetConfig],
    streams: list[_Stream],
    notices: list[str],
    console,
    examples: int,
    folder,
) -> PreparedData:
    started = time.perf_counter()
    estimate = sum(_estimate_rows(s.source) for s in streams)
    requested = max((item.num_proc for item in items if item.num_proc is not None), default=None)
    with (
        Workers(Job(resolved, renderer), processes_for(requested, estimate)) as workers,
        Progress(console, workers.processes) as progress,
    ):
        faults.point("data-prep")
        read, dropped, warnings = _check_every_row(resolved, items, streams, workers, progress)
        check_hold_out(streams, items)
        _choose_held_out(streams, items, resolved.training.get("seed", 42))
        tool_split, unseen = tool_split_of(streams, items)

        any_eval = any(s.eval_mask is not None and s.eval_mask.any() for s in streams)
        wanted = _wanted(streams, examples, resolved.samples, any_eval)
        # pass 2: render + mask + tokenize the valid rows
        # SFT, DPO and KTO rows (the large sets) go to Arrow files as they come: memory stays bounded
        spill = method_of(resolved).cut_by_max_length
        train_out = SplitWriter(folder / "train-sources.arrow", spill)
        eval_out = SplitWriter(folder / "eval.arrow", spill)
        train_rows, eval_rows = [0] * len(items), [0] * len(items)
        truncated_train, truncated_eval = [], []
        negatives_train: list[np.ndarray] = []
        partially, samples, example_rows = 0, {}, {}
        total = sum(s.valid for s in streams)
        progress.start("tokenizing", total)
        for number, stream in enumerate(streams):
            base = 0
            requests = _requests(stream, wanted[number])
            for result in workers.map(tokenize_chunk, requests):
                if result.error is not None:
                    raise result.error
                count = len(result.kept)
                if count != result.expected:
                    raise _changed(stream.source.path)
                held = stream.eval_mask[base : base + count] if stream.eval_mask is not None else np.zeros(count, bool)
                kept_positions = np.flatnonzero(result.kept)  # row i of result.table is valid row kept_positions[i]
                to_eval = held[kept_positions]
                train_out.add(result.table.take(np.flatnonzero(~to_eval)))
                eval_out.add(result.table.take(np.flatnonzero(to_eval)))
                train_rows[stream.item] += int((~to_eval).sum())
                eval_rows[stream.item] += int(to_eval.sum())
                if result.negatives is not None:
                    negatives_train.append(result.negatives[~to_eval])
                for position, file, location, reason in result.truncated_away:
                    (truncated_eval if held[position] else truncated_train).append(DroppedRow(file, location, reason))
                partially += result.partially_truncated
                for position, row in result.examples.items():
                    example_rows[(number, base + position)] = row
                for position, conversation in result.samples.items():
                    samples[(number, base + position)] = conversation
                base += count
                progress.advance(count)

    reports = _source_reports(items, streams, train_rows, eval_rows)
    train = mix(train_out.finish(), items, reports, resolved.training.get("seed", 42), folder / "train.arrow")
    prepared = PreparedData(
        train=train,
        eval=eval_out.finish(),
        rows_read=read,
        dropped=dropped + truncated_train + truncated_eval,
        invalid_skipped=len(dropped),
        fully_truncated=len(truncated_train) + len(truncated_eval),
        partially_truncated=partially,
        sample_messages=[samples[k] for k in sorted(samples)][: resolved.samples],
        warnings=warnings.kept,
        warning_rows=warnings.rows,
        notices=notices,
        sources=reports,
        tool_split=tool_split,
        unseen_tool_rows=unseen,
        tool_held_rows=sum(s.tool_held for s in streams),
    )
    first_rows = [example_rows[k] for k in sorted(example_rows) if example_rows[k].trained_tokens > 0]
    _check_left(prepared, items)
    if method_of(resolved).retrieval:
        _same_negatives(
            prepared, np.concatenate(negatives_train) if negatives_train else np.zeros(0, np.int64), first_rows
        )
    prepared.train.examples = [_inspect_item(row) for row in first_rows[:examples]]
    prepared.seconds = time.perf_counter() - started
    return prepared


class _Warnings:
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


def _estimate_rows(source: Source) -> int:
    if source.limit is not None:
        return source.limit
    if source.hub is not None:
        return len(source.hub)
    return sum(f.stat().st_size for f in source.files) // 1500  # a chat row is ~1-3 KB


def _after_check(stream: _Stream, resolved: ResolvedConfig) -> None:
    """The stream's problems in file order; GRPO's column kinds across rows; another training type's rows."""
    for checked in stream.chunks:
        stream.problems.extend(checked.problems)
    held_out = held_out_names(dataset_list(resolved))
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
    if stream.problems and valid < stream.rows / 2:
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


def _choose_held_out(streams: list[_Stream], items: list[DatasetConfig], seed: int) -> None:
    for stream in streams:
        item = items[stream.item]
        if stream.held_out:
            stream.eval_mask = np.ones(stream.valid, dtype=bool)
        elif not item.val_path and item.test_size:
            stream.eval_mask = held_out_mask(stream.valid, item.test_size, seed, stream.source.path)


def _wanted(streams: list[_Stream], examples: int, samples: int, any_eval: bool) -> dict:
    """Which valid rows (stream number, index) to return in full: the first training rows (what `inspect`
    shows; a few more in case some are cut away by max_length) and the sample conversations."""
    wanted: dict = {number: {"examples": set(), "samples": set()} for number in range(len(streams))}
    need_examples, need_samples = examples + 50, samples
    for number, stream in enumerate(streams):
        mask = stream.eval_mask if stream.eval_mask is not None else np.zeros(stream.valid, bool)
        if need_examples > 0:
            rows = np.flatnonzero(~mask)[:need_examples]
            wanted[number]["examples"].update(int(i) for i in rows)
            need_examples -= len(rows)
        if need_samples > 0:
            rows = np.flatnonzero(mask if any_eval else ~mask)[:need_samples]
            wanted[number]["samples"].update(int(i) for i in rows)
            need_samples -= len(rows)
    return wanted


def _requests(stream: _Stream, wanted: dict):
    base = 0
    for rows, checked in itertools.zip_longest(chunked(stream.source.rows()), stream.chunks):
        if rows is None or checked is None or len(rows) != checked.rows:
            raise _changed(stream.source.path)
        skip = frozenset(stream.skip & {(r.file, r.location) for r in rows}) if stream.skip else frozenset()
        count = checked.valid - len(skip)
        yield TokenizeRequest(
            rows,
            skip=skip | frozenset(checked.image_invalid),  # (invalid already: not in checked.valid)
            expected=count,
            examples=frozenset(i - base for i in wanted["examples"] if base <= i < base + count),
            samples=frozenset(i - base for i in wanted["samples"] if base <= i < base + count),
        )
        base += count


def _changed(path: str) -> LeapError:
    return LeapError(
        "the data changed while it was being prepared (its rows differ between the check and the tokenization)",
        where=path,
        fix="run again once nothing writes to the data",
    )


def _inspect_item(row) -> dict:
    meta = dict(row.meta)
    images = meta.pop("images", None)  # (a row with images: each image's size, tiles and tokens)
    tokens = meta.pop("tokens", row.tokens)  # (with images: the expanded count, image tokens included)
    item = {**row.inspect(), "source": meta, "tokens": tokens, "trained_tokens": row.trained_tokens}
    if images:
        item["images"] = images
    return item


def _check_left(prepared: PreparedData, items: list[DatasetConfig]) -> None:
    if len(prepared.train):
        return
    examples = "; ".join(f"{r.location}: {r.reason}" for r in prepared.dropped[:3])
    raise LeapError(
        f"no training rows are left: {prepared.rows_read} row(s) read, {prepared.invalid_skipped} invalid and skipped "
        f"(dataset.on_invalid: skip), {prepared.fully_truncated} with every trained token beyond max_length"
        + (f"; e.g. {examples}" if examples else ""),
        where=items[0].path,
        fix="set dataset.on_invalid: error to see every problem"
        if prepared.invalid_skipped
        else "raise training_config.max_length",
    )


def _check_row_shape(columns: list[set], resolved: ResolvedConfig, path: str) -> None:
    """Most rows invalid, and they have the columns of another training type: say that, once."""
    if not columns:
        return
    for rows, needed in ROW_SHAPES:
        if all(set(needed) <= c for c in columns):
            if method_of(resolved).rows == rows:
                return
            types = [name for name, m in METHODS.items() if m.rows == rows]
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


def _same_negatives(prepared: PreparedData, counts: np.ndarray, first_rows: list) -> None:
    """The loss reads (query, positive, negative_1..k) with the same k in every row: k is the fewest hard
    negatives a training row has; when rows have more, the report says how many are not used."""
    used = int(counts.min())
    for split in (prepared.train, prepared.eval):
        extra = [c for c in split.table.column_names if c.startswith("negative_") and int(c.split("_")[1]) > used]
        split.table = split.table.drop_columns(extra)
        split.known_fingerprint = None
    for row in first_rows:
        row.negatives_used = used
    unused = int((counts - used).sum())
    if unused:
        prepared.notices.append(
            f"retrieval: every training row uses {used} hard negative(s), the fewest a row has ({counts.min()}-"
            f"{counts.max()} per row): {unused} negative(s) are not trained on; give every row the same number to use "
            "them all (the other rows' documents are negatives too: in-batch)"
        )


def _check_kto_batches(prepared: PreparedData, resolved: ResolvedConfig) -> None:
    """KTO's KL term pairs each prompt with another completion of its batch (recipes/kto.py): a split
    of one row cannot, and a last batch of one row borrows the completion of the row before it."""
    where = dataset_items(resolved)[0]
    for split, rows, key in (
        ("train", prepared.train, "per_device_train_batch_size"),
        ("eval", prepared.eval, "per_device_eval_batch_size"),
    ):
        size = resolved.training.get(key, 8)
        if len(rows) == 1:
            raise LeapError(
                f"the {split} split has 1 row: KTO's KL term pairs each prompt with another row's "
                "completion, so it needs at least 2",
                where=where.val_path or where.path,
                fix="add rows" + (", or a larger dataset.test_size" if split == "eval" else ""),
            )
        if len(rows) > 1 and len(rows) % size == 1:
            prepared.notices.append(
                f"KTO: the last {split} batch holds 1 row ({len(rows)} rows, {key} {size}); its KL term uses the "
                "completion of the row before it, from the previous batch"
            )
