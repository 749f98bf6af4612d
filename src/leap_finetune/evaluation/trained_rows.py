"""Benchmark rows that are also training rows: a benchmark scored on rows the model was trained on measures
memorisation, not the skill. Every benchmark row's prompt and reference turn are compared with the training
conversations - each a digest (data/row_digests.py), so every row is checked at the cost of a hash - and a
benchmark that reads the training data's own file is said even where no row matches."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from leap_finetune.data.prepared import PreparedData, dataset_items
from leap_finetune.data.row_digests import conversation_digest


def trained_benchmark_notes(resolved, benchmarks: list, prepared: PreparedData) -> list[str]:
    """The notes for the data report; `benchmarks`: evaluation/runner.load_benchmarks of resolved.evals (in order)."""
    if resolved.evals is None or prepared.train_turns is None:
        return []
    notes = []
    for bench, loaded in zip(resolved.evals.benchmarks, benchmarks, strict=False):
        if bench.metric == "retrieval":  # (queries and documents, not conversations)
            continue
        digests = [(item, conversation_digest(item_turns(item))) for item in loaded.items]
        known = [(item, d) for item, d in digests if d is not None]
        hits = np.isin(np.asarray([d for _, d in known], dtype=np.uint64), prepared.train_turns)
        if hits.any():
            first = known[int(np.argmax(hits))][0]
            notes.append(
                f"{int(hits.sum()):,} of the {len(loaded.items):,} row(s) of benchmark '{bench.name}' are also "
                f"training rows (their prompt and reference turn are a training conversation), e.g. {first.file}, "
                f"{first.location}: the benchmark measures memorisation of them; remove them from the training "
                "data, or score rows kept out of training"
            )
            continue
        source = _training_source(bench.path, resolved)
        if source is not None:
            notes.append(
                f"benchmark '{bench.name}' reads {bench.path}, which {source} trains on: its rows are training "
                "rows, and the benchmark measures memorisation of them; score rows kept out of training (a file of "
                "their own)"
            )
    return notes


def item_turns(item) -> list[dict]:
    """A benchmark row as the conversation it scores: the prompt, then the reference (a generation's reference
    answer, an episode's solution, a multiple choice's right option) as the assistant's turn."""
    if item.options is not None and item.answer_id is not None:
        answer = item.options[item.answer_id]
    else:
        answer = item.reference
    if answer is None:
        return []
    return [*item.prompt, {"role": "assistant", "content": answer}]


def _training_source(path: str, resolved) -> str | None:
    """Which `dataset:` entry reads the file `path` for training (itself, or the folder it is in), if one does."""
    items = dataset_items(resolved)
    bench = Path(path)
    if not bench.is_absolute() or not bench.exists():
        return None
    for index, item in enumerate(items):
        name = "dataset.path" if len(items) == 1 else f"dataset[{index}].path"
        source = Path(item.path)
        if source == bench or (source.is_dir() and bench.parent == source):
            return name
    return None
