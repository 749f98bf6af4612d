"""Which process of the run this one is. Rank 0 of a distributed run (Ray Train sets RANK in every worker's
environment), or the only process, writes the run folder's files, runs the benchmarks and prints; the other ranks
compute beside it."""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def is_main_process() -> bool:
    """Rank 0 of a distributed run, or the only process: it alone writes the run folder's files, runs the
    benchmarks and prints samples."""
    return rank() == 0
