"""Reading dataset files into rows that remember where they came from.

We read JSONL, JSON, CSV and Parquet ourselves instead of through `datasets.load_dataset`
because (1) every problem must name the file and line, and Arrow's errors do not; (2) Arrow
infers one schema per file and fails on rows that mix shapes the spec allows (content as a
string in one message, a list of parts in the next). Hub datasets go through `datasets`.
"""

from __future__ import annotations

import csv
import json
import sys
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


@dataclass
class ReadResult:
    rows: list[SourceRow]
    problems: list[RowProblem]  # lines that could not even be parsed
    skipped: list[str] = field(default_factory=list)  # folder entries that are not data files (not read)


def read_dataset(path: str, *, split: str = "train", subset: str | None = None, limit: int | None = None,
                 key: str = "dataset.path") -> ReadResult:
    """Every row of a file, a folder of files or a Hub dataset; `key` is the config key that named it."""
    local = Path(path)
    if local.is_dir():
        entries = sorted(p for p in local.iterdir() if not p.name.startswith("."))
        files = [p for p in entries if p.suffix.lower() in SUFFIXES and p.is_file()]
        skipped = [p.name + ("/" if p.is_dir() else "") for p in entries if p not in files]
        if not files:
            raise LeapError(
                f"the folder holds no {', '.join(SUFFIXES)} files"
                + (f" (it holds {', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}; sub-folders are not read)"
                   if skipped else ""),
                where=path, fix=f"point {key} at the folder (or file) that holds your data",
            )
        result = ReadResult([], [], skipped=skipped)
        for file in files:
            part = _read_file(file)
            result.rows.extend(part.rows)
            result.problems.extend(part.problems)
    elif local.is_absolute() or local.exists():
        if not local.exists():
            raise LeapError("file not found", where=f"{key}: {path}",
                            fix=f"check {key} (relative paths start at the config file's folder)")
        result = _read_file(local)
    else:
        result = _read_hub(path, split=split, subset=subset)
    if limit is not None:
        result.rows = result.rows[:limit]
    if not result.rows and not result.problems:
        raise LeapError("the dataset has no rows", where=path, fix="add rows, or check dataset.path / split")
    return result


def _read_file(path: Path) -> ReadResult:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise LeapError(
            f"unsupported file type '{suffix}'", where=str(path), fix=f"use one of {', '.join(SUFFIXES)}"
        )
    if path.stat().st_size == 0:
        raise LeapError("the file is empty", where=str(path), fix="add rows or remove the file")
    reader = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet, ".csv": _read_csv}[suffix]
    return reader(path)


def _read_jsonl(path: Path) -> ReadResult:
    rows, problems = [], []
    with path.open(encoding="utf-8", errors="strict") as handle:
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(SourceRow(str(path), f"line {number}", json.loads(line)))
                except json.JSONDecodeError as err:
                    problems.append(
                        RowProblem(str(path), f"line {number}", "<line>", f"not valid JSON ({err.msg} at character {err.pos + 1})")
                    )
        except UnicodeDecodeError:
            raise _not_utf8(path) from None
    return ReadResult(rows, problems)


def _not_utf8(path: Path) -> LeapError:
    """Where the first byte that is not UTF-8 is (the text decoder reads in blocks, so find it again)."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
        position, line = 0, 1
    except UnicodeDecodeError as err:
        position, line = err.start, data[: err.start].count(b"\n") + 1
    return LeapError(f"the file is not UTF-8 text (byte {data[position]:#04x} on line {line})",
                     where=f"{path}:{line}", fix="save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")


def _read_json(path: Path) -> ReadResult:
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
        return _read_jsonl(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise LeapError(
            f"not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}",
            where=str(path),
            fix="a .json dataset must be one JSON array of row objects (or use .jsonl, one object per line)",
        ) from None
    return ReadResult([SourceRow(str(path), f"row {i}", row) for i, row in enumerate(data, start=1)], [])


def _read_parquet(path: Path) -> ReadResult:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises many types for a broken file
        raise LeapError(f"cannot read the Parquet file: {err}", where=str(path), fix="re-export the file") from None
    return ReadResult([SourceRow(str(path), f"row {i}", row) for i, row in enumerate(table.to_pylist(), start=1)], [])


def _read_csv(path: Path) -> ReadResult:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    rows = []
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            if not reader.fieldnames:
                raise LeapError("the CSV file has no header row", where=str(path))
            for number, row in enumerate(reader, start=1):
                rows.append(SourceRow(str(path), f"row {number} (line {reader.line_num})", dict(row), from_text_table=True))
    except csv.Error as err:
        raise LeapError(f"malformed CSV: {err}", where=str(path)) from None
    except UnicodeDecodeError:
        raise _not_utf8(path) from None
    return ReadResult(rows, [])


def _read_hub(name: str, *, split: str, subset: str | None) -> ReadResult:
    import datasets

    try:
        data = datasets.load_dataset(name, subset, split=split)
    except Exception as err:  # noqa: BLE001 - offline, missing, gated: all user-fixable
        raise LeapError(
            f"cannot load the Hugging Face dataset '{name}' (split '{split}'"
            + (f", subset '{subset}'" if subset else "")
            + f"): {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
            where="dataset.path",
            fix="check the dataset id, split and subset; offline, use a local file or a dataset already in the HF cache",
        ) from None
    source = f"{name}[{split}]"
    return ReadResult([SourceRow(source, f"row {i}", row) for i, row in enumerate(data, start=1)], [])
