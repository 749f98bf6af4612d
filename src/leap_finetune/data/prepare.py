"""The data pipeline the driver runs before any model loads: read -> validate every row -> split ->
render + mask + tokenize -> mix -> report, cached on disk (data/cache.py).

Two passes over each source, chunk by chunk, on every core (data/chunks.py): the first checks every row
(data/row_check.py: so every problem is listed before anything is tokenized, as `validate` promises), the
second tokenizes the valid rows into Arrow tables (here). Each row kind's checker and tokenizer are in
data/row_kinds.py. Only the current chunks are in memory as Python objects.

Nothing is dropped silently: invalid rows (with `on_invalid: skip`) and rows whose trained tokens
were all cut off by `max_length` are counted, listed, and saved by the driver.
"""

from __future__ import annotations

import itertools
import shutil
import time

import numpy as np

from leap_finetune import faults
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.schema_dataset import DatasetConfig
from leap_finetune.data import cache
from leap_finetune.data.chunks import (
    Job,
    TokenizedChunk,
    TokenizeRequest,
    Workers,
    chunked,
    processes_for,
    tokenize_chunk,
)
from leap_finetune.data.held_out_tools import check_hold_out, tool_split_of
from leap_finetune.data.mixing import mix
from leap_finetune.data.prepared import DroppedRow, PreparedData, dataset_items
from leap_finetune.data.progress import Progress
from leap_finetune.data.row_check import (
    Stream,
    check_every_row,
    choose_held_out,
    estimate_rows,
    source_reports,
    streams_of,
)
from leap_finetune.data.row_kinds import row_kind_of
from leap_finetune.data.table import RowTable, SplitWriter
from leap_finetune.errors import LeapError
from leap_finetune.files import is_disk_full
from leap_finetune.methods import method_of


def prepare_data(
    resolved: ResolvedConfig, tokenizer, renderer, *, console=None, examples: int = 5, use_cache: bool = True
) -> PreparedData:
    items = dataset_items(resolved)
    streams, notices = streams_of(items)
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
            streams = [Stream(s.item, s.source, s.held_out) for s in streams]  # (read again from the start)
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


def count_rows(resolved: ResolvedConfig, *, console=None) -> PreparedData:
    """Every row checked as `prepare_data` checks it, split and mixed, without a tokenizer: what `plan` does
    where the model's tokenizer is not at hand. Its tables hold row positions, not tokens (`tokenized` is
    False): no token counts, and rows that max_length would cut away entirely are still counted."""
    import tempfile
    from pathlib import Path

    import pyarrow as pa

    items = dataset_items(resolved)
    streams, notices = streams_of(items)
    requested = max((item.num_proc for item in items if item.num_proc is not None), default=None)
    estimate = sum(estimate_rows(s.source) for s in streams)
    with (
        Workers(Job(resolved, None), processes_for(requested, estimate)) as workers,
        Progress(console, workers.processes) as progress,
    ):
        read, dropped, warnings = check_every_row(resolved, items, streams, workers, progress)
    check_hold_out(streams, items)
    choose_held_out(streams, items, resolved.training.get("seed", 42))
    tool_split, unseen = tool_split_of(streams, items)
    train_rows, eval_rows = [0] * len(items), [0] * len(items)
    for stream in streams:
        held = int(stream.eval_mask.sum()) if stream.eval_mask is not None else 0
        train_rows[stream.item] += stream.valid - held
        eval_rows[stream.item] += held
    reports = source_reports(items, streams, train_rows, eval_rows)

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


def _prepare_now(
    resolved: ResolvedConfig,
    renderer,
    items: list[DatasetConfig],
    streams: list[Stream],
    notices: list[str],
    console,
    examples: int,
    folder,
) -> PreparedData:
    started = time.perf_counter()
    estimate = sum(estimate_rows(s.source) for s in streams)
    requested = max((item.num_proc for item in items if item.num_proc is not None), default=None)
    with (
        Workers(Job(resolved, renderer), processes_for(requested, estimate)) as workers,
        Progress(console, workers.processes) as progress,
    ):
        faults.point("data-prep")
        read, dropped, warnings = check_every_row(resolved, items, streams, workers, progress)
        check_hold_out(streams, items)
        choose_held_out(streams, items, resolved.training.get("seed", 42))
        tool_split, unseen = tool_split_of(streams, items)

        any_eval = any(s.eval_mask is not None and s.eval_mask.any() for s in streams)
        wanted = _wanted(streams, examples, resolved.samples, any_eval)
        # pass 2: render + mask + tokenize the valid rows
        splits = _Splits(folder, row_kind_of(resolved).spills, len(items))
        progress.start("tokenizing", sum(s.valid for s in streams))
        for number, stream in enumerate(streams):
            base = 0
            share = _disguise_share(items[stream.item].augment_tools)
            for result in workers.map(tokenize_chunk, _requests(stream, wanted[number], share)):
                count = splits.add(number, stream, base, result)
                base += count
                progress.advance(count)

    reports = source_reports(items, streams, splits.train_rows, splits.eval_rows)
    notices = notices + splits.leak_notice() + _disguise_notice(items, splits)
    train = mix(splits.train.finish(), items, reports, resolved.training.get("seed", 42), folder / "train.arrow")
    truncated = splits.truncated_train + splits.truncated_eval
    prepared = PreparedData(
        train=train,
        eval=splits.eval.finish(),
        rows_read=read,
        dropped=dropped + truncated,
        invalid_skipped=len(dropped),
        fully_truncated=len(truncated),
        partially_truncated=splits.partially,
        sample_messages=[splits.samples[k] for k in sorted(splits.samples)][: resolved.samples],
        warnings=warnings.kept,
        warning_rows=warnings.rows,
        notices=notices,
        sources=reports,
        tool_split=tool_split,
        unseen_tool_rows=unseen,
        tool_held_rows=sum(s.tool_held for s in streams),
        train_turns=np.unique(np.asarray(splits.train_turns, dtype=np.uint64)),
    )
    first_rows = [row for _, row in sorted(splits.example_rows.items()) if row.trained_tokens > 0]
    _check_left(prepared, items)
    if method_of(resolved).retrieval:
        negatives = splits.negatives_train
        _same_negatives(prepared, np.concatenate(negatives) if negatives else np.zeros(0, np.int64), first_rows)
    prepared.train.examples = [_inspect_item(row) for row in first_rows[:examples]]
    prepared.seconds = time.perf_counter() - started
    return prepared


class _Splits:
    """Pass 2's chunks as they come, sorted into the training and the evaluation split, with the rows max_length
    cut away (of each split) and the rows returned in full (`inspect`'s, the sample conversations)."""

    def __init__(self, folder, spill: bool, sources: int):
        # spill: the large sets go to Arrow files as they come (data/row_kinds.py): memory stays bounded
        self.train = SplitWriter(folder / "train-sources.arrow", spill)
        self.eval = SplitWriter(folder / "eval.arrow", spill)
        self.train_rows, self.eval_rows = [0] * sources, [0] * sources  # per source
        self.train_digests: list[np.ndarray] = []  # (data/row_digests.trained_digest of each row of the split)
        self.eval_digests: list[np.ndarray] = []
        self.train_turns: list[int] = []  # (data/row_digests.turn_digests of each training row: benchmark rows)
        self.truncated_train: list[DroppedRow] = []
        self.truncated_eval: list[DroppedRow] = []
        self.negatives_train: list[np.ndarray] = []
        self.partially = 0
        self.disguised, self.not_disguised = 0, 0  # dataset.augment_tools
        self.samples: dict = {}  # (stream number, valid row) -> Conversation
        self.example_rows: dict = {}  # (stream number, valid row) -> the row tokenized in full

    def add(self, number: int, stream: Stream, base: int, result: TokenizedChunk) -> int:
        """One chunk of stream `number`, whose valid rows before it are `base`; returns the chunk's valid rows."""
        if result.error is not None:
            raise result.error
        count = len(result.kept)
        if count != result.expected:
            raise _changed(stream.source.path)
        held = stream.eval_mask[base : base + count] if stream.eval_mask is not None else np.zeros(count, bool)
        kept_positions = np.flatnonzero(result.kept)  # row i of result.table is valid row kept_positions[i]
        to_eval = held[kept_positions]
        if result.hashes is not None:
            kept_hashes = result.hashes[kept_positions]
            self.train_digests.append(kept_hashes[~to_eval])
            self.eval_digests.append(kept_hashes[to_eval])
        for position in kept_positions[~to_eval]:
            self.train_turns.extend(result.turns[position] if result.turns else ())
        self.train.add(result.table.take(np.flatnonzero(~to_eval)))
        self.eval.add(result.table.take(np.flatnonzero(to_eval)))
        self.train_rows[stream.item] += int((~to_eval).sum())
        self.eval_rows[stream.item] += int(to_eval.sum())
        if result.negatives is not None:
            self.negatives_train.append(result.negatives[~to_eval])
        for position, file, location, reason in result.truncated_away:
            (self.truncated_eval if held[position] else self.truncated_train).append(DroppedRow(file, location, reason))
        self.partially += result.partially_truncated
        self.disguised += result.disguised
        self.not_disguised += result.not_disguised
        for position, row in result.examples.items():
            self.example_rows[(number, base + position)] = row
        for position, conversation in result.samples.items():
            self.samples[(number, base + position)] = conversation
        return count

    def leak_notice(self) -> list[str]:
        """Evaluation rows that are training rows too - the same row in both splits, however it got there (a row
        repeated in a file, files read for both, val_path holding training rows, a mixture): counted, and said."""
        if not self.eval_digests or not self.train_digests:
            return []
        held, trained = np.concatenate(self.eval_digests), np.concatenate(self.train_digests)
        both = int(np.isin(held, trained).sum())
        if not both:
            return []
        return [
            f"{both:,} of the {len(held):,} evaluation row(s) are also training rows (the same row in both splits: a "
            "row repeated in the data, or files read for both): the eval loss and the benchmarks on the eval split "
            "measure memorisation there; remove the duplicates, or keep evaluation rows in a file of their own "
            "(val_path)"
        ]


def _wanted(streams: list[Stream], examples: int, samples: int, any_eval: bool) -> dict:
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


def _disguise_share(augment_tools: bool | float) -> float:
    return 1.0 if augment_tools is True else float(augment_tools or 0.0)


def _disguise_notice(items: list[DatasetConfig], splits: _Splits) -> list[str]:
    """dataset.augment_tools: how many training rows were disguised; none is an error (the key would do nothing)."""
    keyed = [i for i, item in enumerate(items) if item.augment_tools is not False]
    if not keyed:
        return []
    key = "dataset.augment_tools" if len(items) == 1 else f"dataset[{keyed[0]}].augment_tools"
    if splits.disguised == 0:
        raise LeapError(
            "no training row has tool definitions to disguise (a `tools` column, or a JSON tool list in the system "
            "prompt after <|tool_list_start|> or 'List of tools:'), so the key would change nothing",
            where=key,
            fix=f"give the rows their tool definitions in a `tools` column, or remove {key}",
        )
    text = f"augment_tools: {splits.disguised:,} training row(s) are shown their tools disguised (evaluation rows: the real ones)"
    if splits.not_disguised:
        text += f"; {splits.not_disguised:,} row(s) with tool calls have no definitions to disguise and keep theirs"
    return [text]


def _requests(stream: Stream, wanted: dict, share: float = 0.0):
    base = 0
    for rows, checked in itertools.zip_longest(chunked(stream.source.rows()), stream.chunks):
        if rows is None or checked is None or len(rows) != checked.row_count:
            raise _changed(stream.source.path)
        skip = frozenset(stream.skip & {(r.file, r.location) for r in rows}) if stream.skip else frozenset()
        count = checked.valid - len(skip)
        yield TokenizeRequest(
            rows,
            skip=skip | frozenset(checked.image_invalid),  # (invalid already: not in checked.valid)
            expected=count,
            examples=frozenset(i - base for i in wanted["examples"] if base <= i < base + count),
            samples=frozenset(i - base for i in wanted["samples"] if base <= i < base + count),
            disguise=_training_positions(stream, base, count) if share else frozenset(),
            disguise_share=share,
        )
        base += count


def _training_positions(stream: Stream, base: int, count: int) -> frozenset:
    """The chunk's valid rows that are training rows (positions within the chunk)."""
    if stream.eval_mask is None:
        return frozenset(range(count))
    return frozenset(int(i) for i in np.flatnonzero(~stream.eval_mask[base : base + count]))


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
