"""Which rows train: the held-out split of a source, and the mix of several sources (`weight`, `epochs`)."""

from __future__ import annotations

import os
import random

import numpy as np
import pyarrow as pa

from leap_finetune.data.table import RowTable, read_table
from leap_finetune.errors import LeapError


def held_out_mask(valid: int, test_size: float, seed: int, path: str) -> np.ndarray:
    """Which of `valid` rows are held out (a mask): `test_size` rows (a count) or that share, chosen by `seed`."""
    count = int(test_size) if test_size >= 1 else max(1, round(valid * test_size))
    if count >= valid:
        raise LeapError(
            f"dataset.test_size asks for {count} evaluation rows, but the dataset has {valid} valid rows "
            "(at least one must be left to train on)",
            where=path,
            fix="use a smaller test_size, or a separate val_path",
        )
    order = list(range(valid))
    random.Random(seed).shuffle(order)
    mask = np.zeros(valid, dtype=bool)
    mask[order[:count]] = True
    return mask


def mix(table: RowTable, items: list, reports: list, seed: int, path) -> RowTable:
    """Each source's training rows per epoch (the sources' rows are consecutive in `table`): as they are,
    `epochs` times, or its `weight`'s share of the mix. Without weights or epochs the table is used as it is."""
    rng = np.random.default_rng(seed)
    # Shares from weights scaled by the largest: finite for any finite weights (1e308 + 1e308 would be inf)
    largest = max((item.weight for item in items if item.weight is not None), default=1.0)
    weights = [item.weight / largest for item in items if item.weight is not None]
    total = sum(r.train_rows for r in reports)
    orders, start = [], 0
    for index, (item, report) in enumerate(zip(items, reports, strict=True)):
        rows = report.train_rows
        if not rows and len(items) > 1:
            raise LeapError(
                f"no training rows are left from this source ({report.rows_read} read, {report.valid} valid, "
                f"{report.eval_rows} held out for evaluation, the rest cut off by max_length): nothing of it would "
                "be trained",
                where=f"dataset[{index}]: {item.path}",
                fix="raise training_config.max_length, lower its test_size, or remove the source",
            )
        if item.weight is not None:
            target = round(total * (item.weight / largest) / sum(weights))
            report.mixing = f"weight {item.weight:g}"
        else:
            target = round(rows * (item.epochs if item.epochs is not None else 1))
            report.mixing = f"epochs {item.epochs:g}" if item.epochs is not None else ""
        if rows and not target:  # (a weight or epochs so small that the source would train nothing)
            raise LeapError(
                f"{report.mixing} takes 0 of this source's {rows} training rows: nothing of it would be trained",
                where=f"dataset[{index}]: {item.path}",
                fix="raise its weight / epochs, or remove the source",
            )
        if rows and target != rows:
            whole, rest = divmod(target, rows)
            order = np.concatenate(
                [np.tile(np.arange(rows), whole), np.sort(rng.choice(rows, size=rest, replace=False))]
            )
        else:
            order = np.arange(rows if rows else 0)
        orders.append(order + start)
        report.used_rows = len(order)
        report.train_tokens = int(table.tokens_per_row[order + start].sum())
        start += rows
    order = np.concatenate(orders) if orders else np.zeros(0, np.int64)
    if len(order) == len(table) and (order == np.arange(len(table))).all():
        if (path.parent / "train-sources.arrow").exists():
            os.replace(path.parent / "train-sources.arrow", path)  # (still mapped: the same file)
        return table
    mixed = table.take(order)
    if (path.parent / "train-sources.arrow").exists():
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, mixed.table.schema) as writer:
            writer.write_table(mixed.table)
        os.remove(path.parent / "train-sources.arrow")
        mixed = RowTable(read_table(path), mixed.tokens_per_row, mixed.trained_per_row)
    return mixed
