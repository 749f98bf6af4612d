"""Prepared rows held as Arrow columns, not Python objects.

A Python list of ints costs ~36 bytes a token; an Arrow list<int32> column 4. 100k conversations of
~800 tokens (input_ids + labels) are ~0.6 GB here instead of ~6 GB, and the table is what the run
folder and the cache store (memory-mapped when read back).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

# columns whose type cannot be read from the values when a chunk has only empty lists (text rows of an image run)
TYPED_COLUMNS = {"image_sources": pa.list_(pa.string()), "image_tokens": pa.list_(pa.int32())}


def columns_to_table(rows: list[dict]) -> pa.Table:
    """The trainer's columns of a chunk of rows. Token-id columns given as NumPy arrays become
    list<int32> without a Python loop over tokens; other columns are typed by Arrow. A column that only
    some rows have (a GRPO row's extra field, a retrieval row's 5th negative) is null in the others."""
    keys = list(dict.fromkeys(key for row in rows for key in row))
    arrays = {}
    for key in keys:
        values = [row.get(key) for row in rows]
        if values and all(isinstance(v, np.ndarray) for v in values):
            lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
            offsets = np.zeros(len(values) + 1, dtype=np.int32)
            np.cumsum(lengths, out=offsets[1:])
            flat = np.concatenate(values).astype(np.int32, copy=False) if len(values) else np.zeros(0, np.int32)
            arrays[key] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
        else:
            arrays[key] = pa.array(
                [v.tolist() if isinstance(v, np.ndarray) else v for v in values], type=TYPED_COLUMNS.get(key)
            )
    return pa.table(arrays) if arrays else pa.table({})


@dataclass
class RowTable:
    """The prepared rows of one split: `table` (what the trainer reads), per-row token counts, and the
    first rows in full (`examples`: what `inspect` shows)."""

    table: pa.Table
    tokens_per_row: np.ndarray  # int64
    trained_per_row: np.ndarray  # int64
    examples: list = field(default_factory=list)  # inspect items of the first rows, in order
    known_fingerprint: str | None = None

    @classmethod
    def empty(cls) -> RowTable:
        return cls(pa.table({}), np.zeros(0, np.int64), np.zeros(0, np.int64))

    @classmethod
    def concat(cls, parts: list[RowTable]) -> RowTable:
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        table = pa.concat_tables([p.table for p in parts], promote_options="permissive").combine_chunks()
        return cls(
            table,
            np.concatenate([p.tokens_per_row for p in parts]),
            np.concatenate([p.trained_per_row for p in parts]),
            [e for p in parts for e in p.examples],
        )

    def __post_init__(self):
        if self.known_fingerprint is None and self.table.num_columns == 0:
            self.known_fingerprint = Fingerprint().hexdigest(self.table.schema)

    def take(self, indices: np.ndarray) -> RowTable:
        indices = np.asarray(indices, dtype=np.int64)
        return RowTable(self.table.take(pa.array(indices)), self.tokens_per_row[indices], self.trained_per_row[indices])

    def __len__(self) -> int:
        return len(self.tokens_per_row)

    def __getitem__(self, index: int) -> dict:
        """One row's columns as Python values (for tests and small tools; iterate the table for more)."""
        return {name: self.table.column(name)[index].as_py() for name in self.table.column_names}

    @property
    def tokens(self) -> int:
        return int(self.tokens_per_row.sum())

    @property
    def trained_tokens(self) -> int:
        return int(self.trained_per_row.sum())

    def images(self) -> tuple[int, int, int]:
        """(rows with images, images, image tokens) of an image run's rows; zeros for text rows."""
        if "image_tokens" not in self.table.column_names:
            return 0, 0, 0
        import pyarrow.compute as pc

        column = self.table.column("image_tokens")
        flat = pc.list_flatten(column)
        rows = int(pc.sum(pc.greater(pc.list_value_length(column), 0)).as_py() or 0)
        return rows, len(flat), int(pc.sum(flat).as_py() or 0)

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist() if name in self.table.column_names else [None] * len(self)

    def dataset(self):
        """A `datasets.Dataset` over the table (no copy)."""
        from datasets import Dataset
        from datasets.table import InMemoryTable

        return Dataset(InMemoryTable(self.table))

    def fingerprint(self) -> str:
        """A hash of every value, column by column in name order, independent of how the table is chunked.
        Computed while the rows are written (SplitWriter) and kept in the cache, so the token ids of a
        memory-mapped table are not read back into memory for it."""
        if self.known_fingerprint is None:
            digest = Fingerprint()
            digest.update(self.table)
            self.known_fingerprint = digest.hexdigest(self.table.schema)
        return self.known_fingerprint


class Fingerprint:
    """RowTable.fingerprint, fed a table at a time."""

    def __init__(self):
        self.columns: dict[str, tuple] = {}

    def update(self, table: pa.Table) -> None:
        for name in table.column_names:
            column = table.column(name)
            lengths, values = self.columns.setdefault(name, (hashlib.sha256(), hashlib.sha256()))
            token_ids = pa.types.is_list(column.type) and pa.types.is_integer(column.type.value_type)
            for chunk in column.chunks:
                if token_ids:
                    lengths.update(
                        chunk.value_lengths().fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64).tobytes()
                    )
                    values.update(chunk.flatten().to_numpy(zero_copy_only=False).astype(np.int64).tobytes())
                else:
                    for value in chunk.to_pylist():
                        values.update(repr(value).encode() + b"\x00")

    def hexdigest(self, schema: pa.Schema) -> str:
        digest = hashlib.sha256()
        for name in sorted(schema.names):
            lengths, values = self.columns.get(name, (hashlib.sha256(), hashlib.sha256()))
            digest.update(f"{name}:{schema.field(name).type}:".encode() + lengths.digest() + values.digest())
        return digest.hexdigest()


def read_table(path) -> pa.Table:
    """An Arrow file, memory-mapped: its pages are read when used and belong to the page cache, not to
    this process's memory."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


class SplitWriter:
    """The rows of one split as they are prepared, appended to an Arrow file (`spill`) or kept in memory
    (columns that differ between chunks: GRPO's passed-through fields, retrieval's negatives)."""

    def __init__(self, path, spill: bool):
        self.path, self.spill = path, spill
        self.parts: list[RowTable] = []
        self.counts: list[tuple[np.ndarray, np.ndarray]] = []
        self.sink = self.writer = self.schema = None
        self.fingerprint = Fingerprint()

    def add(self, part: RowTable) -> None:
        if not len(part):
            return
        if not self.spill:
            self.parts.append(part)
            return
        if self.writer is None:
            self.sink = pa.OSFile(str(self.path), "wb")
            self.schema = part.table.schema
            self.writer = pa.ipc.new_file(self.sink, self.schema)
        table = part.table.cast(self.schema) if part.table.schema != self.schema else part.table
        self.writer.write_table(table)
        self.fingerprint.update(table)
        self.counts.append((part.tokens_per_row, part.trained_per_row))

    def finish(self) -> RowTable:
        if not self.spill:
            return RowTable.concat(self.parts)
        if self.writer is None:
            return RowTable.empty()
        self.writer.close()
        self.sink.close()
        return RowTable(
            read_table(self.path),
            np.concatenate([c[0] for c in self.counts]),
            np.concatenate([c[1] for c in self.counts]),
            known_fingerprint=self.fingerprint.hexdigest(self.schema),
        )

    def close(self) -> None:
        if self.writer is not None and not self.sink.closed:
            self.writer.close()
            self.sink.close()
