"""What the data step hands on: the prepared splits and everything the data report, the run folder and the cache
say about them (data/prepare.py makes them, data/cache.py keeps them on disk and reads them back)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.schema_dataset import DatasetConfig
from leap_finetune.data.sft_rows import Conversation, RowWarning
from leap_finetune.data.table import RowTable


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
    # the training rows' conversations (data/row_digests.turn_digests, sorted): benchmark rows that are training rows
    # are found by them (evaluation/trained_rows.py); None where not known (count_rows)
    train_turns: np.ndarray | None = None

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
