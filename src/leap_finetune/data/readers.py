"""Reading dataset files into rows that remember where they came from.

We read JSONL, JSON, CSV and Parquet ourselves instead of through `datasets.load_dataset`
because (1) every problem must name the file and line, and Arrow's errors do not; (2) Arrow
infers one schema per file and fails on rows that mix shapes the spec allows (content as a
string in one message, a list of parts in the next). Hub datasets go through `datasets`.
"""

from __future__ import annotations

import csv
import itertools
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leap_finetune.errors import LeapError, RowProblem

SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


@dataclass
class SourceRow:
    file: str
    location: str  # "line 12" (JSONL), "row 3" (1-based for JSON arrays, Parquet, CSV, Hub)
    data: Any
    from_text_table: bool = False  # CSV: structured fields arrive as JSON text
    image_root: str | None = (
        None  # dataset.image_root: where the row's relative image paths start (else its file's folder)
    )
    raw_json: bool = False  # JSONL: `data` is the line's text, parsed where the row is checked (parse_row)


def parse_row(row: SourceRow) -> RowProblem | None:
    """Parse a JSONL line in place (done by the process that checks the row, not by the reader)."""
    if not row.raw_json:
        return None
    try:
        row.data = json.loads(row.data)
    except json.JSONDecodeError as err:
        return RowProblem(row.file, row.location, "<line>", f"not valid JSON ({err.msg} at character {err.pos + 1})")
    row.raw_json = False
    return None


@dataclass
class ReadResult:
    rows: list[SourceRow]
    problems: list[RowProblem]  # lines that could not even be parsed
    skipped: list[str] = field(default_factory=list)  # folder entries that are not data files (not read)


class Source:
    """One dataset source (a file, a folder of files or a Hub dataset), read as a stream of rows - twice
    by the data step (check, then tokenize), so nothing but the current chunk is held in memory."""

    def __init__(
        self,
        path: str,
        *,
        split: str = "train",
        subset: str | None = None,
        limit: int | None = None,
        key: str = "dataset.path",
        image_root: str | None = None,
    ):
        self.path, self.split, self.subset, self.limit, self.key = path, split, subset, limit, key
        self.image_root = image_root
        self.skipped: list[str] = []
        self.hub = None
        local = Path(path)
        self.splits: dict[str, list[Path]] = {}  # a folder in the Hub's layout: its files by split (data/splits.py)
        self.mixed = ""  # an ordinary folder with a file named like an evaluation split among its training files
        if local.is_dir():
            from leap_finetune.data.splits import eval_named, read_layout

            self.splits, unread = read_layout(local, SUFFIXES)
            self.mixed = "" if self.splits else eval_named(local, SUFFIXES)
        if self.splits:
            self.skipped = unread  # (files named by no split, other sub-folders: not read, and said)
            if split not in self.splits:
                named = ", ".join(f"{s} ({len(f)} file(s))" for s, f in self.splits.items())
                raise LeapError(
                    f"the folder's files are named by split ({named}, as datasets reads a folder): no split '{split}'",
                    where=f"{key}: {path}",
                    fix=f"set dataset.split to one of {', '.join(self.splits)} (the split trained on; default train)",
                )
            self.files = self.splits[split]
        elif local.is_dir():
            entries = sorted(p for p in local.iterdir() if not p.name.startswith("."))
            self.files = [p for p in entries if p.suffix.lower() in SUFFIXES and p.is_file()]
            self.skipped = [p.name + ("/" if p.is_dir() else "") for p in entries if p not in self.files]
            if not self.files:
                raise LeapError(
                    f"the folder holds no {', '.join(SUFFIXES)} files"
                    + (
                        f" (it holds {', '.join(self.skipped[:5])}{' ...' if len(self.skipped) > 5 else ''}; "
                        "sub-folders are not read)"
                        if self.skipped
                        else ""
                    ),
                    where=path,
                    fix=f"point {key} at the folder (or file) that holds your data",
                )
        elif local.is_absolute() or local.exists():
            if not local.exists():
                raise LeapError(
                    "file not found",
                    where=f"{key}: {path}",
                    fix=f"check {key} (relative paths start at the config file's folder)",
                )
            self.files = [local]
        else:
            self.files = []
            self.hub = _read_hub(path, split=split, subset=subset, limit=limit, key=key)
        for file in self.files:
            _check_file(file)

    @property
    def local(self) -> bool:
        return self.hub is None

    def rows(self) -> Iterator[SourceRow]:
        """The rows in order (at most `limit`)."""
        if self.hub is not None:
            name = f"{self.path}[{self.split}]"
            rows = (SourceRow(name, f"row {i}", row) for i, row in enumerate(self.hub, start=1))
        else:
            rows = (row for file in self.files for row in _file_rows(file))
        rows = itertools.islice(rows, self.limit)
        return rows if self.image_root is None else map(self._with_image_root, rows)

    def _with_image_root(self, row: SourceRow) -> SourceRow:
        row.image_root = self.image_root
        return row


def read_dataset(
    path: str, *, split: str = "train", subset: str | None = None, limit: int | None = None, key: str = "dataset.path"
) -> ReadResult:
    """Every row of a file, a folder of files or a Hub dataset, parsed; `key` is the config key that named it."""
    source = Source(path, split=split, subset=subset, limit=limit, key=key)
    result = ReadResult([], [], skipped=source.skipped)
    for row in source.rows():
        problem = parse_row(row)
        (result.problems if problem else result.rows).append(problem or row)
    if not result.rows and not result.problems:
        raise LeapError("the dataset has no rows", where=path, fix="add rows, or check dataset.path / split")
    return result


def _check_file(path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise LeapError(f"unsupported file type '{suffix}'", where=str(path), fix=f"use one of {', '.join(SUFFIXES)}")
    if path.stat().st_size == 0:
        raise LeapError("the file is empty", where=str(path), fix="add rows or remove the file")


def _file_rows(path: Path) -> Iterator[SourceRow]:
    reader = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet, ".csv": _read_csv}
    return reader[path.suffix.lower()](path)


def _read_jsonl(path: Path) -> Iterator[SourceRow]:
    with path.open(encoding="utf-8", errors="strict") as handle:
        try:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    yield SourceRow(str(path), f"line {number}", line, raw_json=True)
        except UnicodeDecodeError:
            raise _not_utf8(path) from None


def _not_utf8(path: Path) -> LeapError:
    """Where the first byte that is not UTF-8 is (the text decoder reads in blocks, so find it again)."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
        position, line = 0, 1
    except UnicodeDecodeError as err:
        position, line = err.start, data[: err.start].count(b"\n") + 1
    return LeapError(
        f"the file is not UTF-8 text (byte {data[position]:#04x} on line {line})",
        where=f"{path}:{line}",
        fix="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
    )


def _read_json(path: Path) -> Iterator[SourceRow]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    if not text.lstrip().startswith("["):
        # Many ".json" files are really JSON Lines; a file that is one JSON object spread over
        # several lines is not, and would otherwise be reported as one "not valid JSON" per line.
        if text.lstrip().startswith("{"):
            try:
                whole = json.loads(text)
            except json.JSONDecodeError:
                whole = None
            if isinstance(whole, dict):
                lists = [key for key, value in whole.items() if isinstance(value, list)]
                raise LeapError(
                    "a .json dataset must be an array of rows ([{...}, {...}]); this file holds one object"
                    + (f" with the list(s) {', '.join(repr(k) for k in lists)}" if lists else ""),
                    where=str(path),
                    fix="write the rows as a JSON array, or one object per line in a .jsonl file"
                    + (f" (e.g. the items of {lists[0]!r})" if lists else ""),
                )
        del text
        yield from _read_jsonl(path)
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise LeapError(
            f"not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}",
            where=str(path),
            fix="a .json dataset must be one JSON array of row objects (or use .jsonl, one object per line)",
        ) from None
    del text
    for i, row in enumerate(data, start=1):
        yield SourceRow(str(path), f"row {i}", row)


def _read_parquet(path: Path) -> Iterator[SourceRow]:
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises many types for a broken file
        raise LeapError(f"cannot read the Parquet file: {err}", where=str(path), fix="re-export the file") from None
    number = 0
    try:
        for batch in handle.iter_batches(batch_size=1024):  # a row group at a time, not the whole table
            for row in batch.to_pylist():
                number += 1
                yield SourceRow(str(path), f"row {number}", row)
    except OSError as err:  # a damaged row group
        raise LeapError(
            f"cannot read the Parquet file after row {number}: {err}", where=str(path), fix="re-export the file"
        ) from None


def _read_csv(path: Path) -> Iterator[SourceRow]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            if not reader.fieldnames:
                raise LeapError("the CSV file has no header row", where=str(path))
            for number, row in enumerate(reader, start=1):
                yield SourceRow(str(path), f"row {number} (line {reader.line_num})", dict(row), from_text_table=True)
    except csv.Error as err:
        raise LeapError(f"malformed CSV: {err}", where=str(path)) from None
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _read_hub(name: str, *, split: str, subset: str | None, limit: int | None, key: str = "dataset.path"):
    """A Hub dataset as an iterable of rows. With `limit`, streamed: only the first rows are downloaded
    (the whole split is never read), and they are kept (the data step reads them twice). While the Hub does not
    answer (hub_access.py), only the HF cache is read: an error at once, not a minute of retries."""
    import datasets

    from leap_finetune.hub_access import hub_unreachable

    unreachable = hub_unreachable()
    if unreachable is not None:
        try:
            with _cache_only():
                return _load_hub(datasets, name, split=split, subset=subset, limit=limit)
        except Exception as err:  # noqa: BLE001 - not in the cache (or a broken entry): the same one line
            raise LeapError(
                f"cannot load the Hugging Face dataset '{name}' (split '{split}'"
                + (f", subset '{subset}'" if subset else "")
                + f"): it is not in the Hugging Face cache, and the Hub cannot be used ({unreachable})",
                where=key,
                fix="check your network; to work offline, run this command once where the Hub is reachable (the "
                f"rows it reads stay in the datasets cache), or point {key} at a local file",
            ) from err
    try:
        return _load_hub(datasets, name, split=split, subset=subset, limit=limit)
    except Exception as err:  # noqa: BLE001 - offline, missing, gated: all user-fixable
        raise LeapError(
            f"cannot load the Hugging Face dataset '{name}' (split '{split}'"
            + (f", subset '{subset}'" if subset else "")
            + f"): {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
            where=key,
            fix="check the dataset id, split and subset; offline, use a local file or a dataset already in the HF cache",
        ) from None


def _load_hub(datasets, name: str, *, split: str, subset: str | None, limit: int | None):
    if limit is None:
        return datasets.load_dataset(name, subset, split=split)  # Arrow, memory-mapped from the HF cache
    if "[" not in split:  # (a sliced split such as train[:10%] cannot be streamed)
        try:
            return list(datasets.load_dataset(name, subset, split=split, streaming=True).take(limit))
        except Exception:  # noqa: BLE001 - e.g. offline with the dataset in the HF cache: read from there
            pass
    return list(datasets.load_dataset(name, subset, split=split).select(range(limit)))


class _cache_only:
    """datasets (and huggingface_hub under it) in offline mode for one load: the cache, no request, no retry."""

    def __enter__(self):
        import datasets.config
        import huggingface_hub.constants

        self.saved = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
        datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = True

    def __exit__(self, *exc):
        import datasets.config
        import huggingface_hub.constants

        datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = self.saved
