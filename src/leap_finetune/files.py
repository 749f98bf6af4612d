"""Files written whole or not at all, and the run's metrics.jsonl read back (light: no torch or transformers import, so that `leap-finetune eval`
and the driver start fast)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see either the old content or the whole new content."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_metrics(path: Path) -> list[dict]:
    """The records of a run's metrics.jsonl, in order (none if it does not exist yet; a line being written
    is skipped)."""
    import json

    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
