"""The default SFT sampler (train_sampling_strategy: batch_rebalance, recipes/sampling.py): every row once
per epoch, a step's rows independent of the number of workers, and workers' tokens balanced."""

from __future__ import annotations

import math
import random

import pytest

from leap_finetune.recipes.sampling import _token_balanced_class


def _lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [int(min(2040, max(200, rng.lognormvariate(math.log(700), 0.6)))) for _ in range(n)]


def _epoch(lengths, per_device, workers, accumulation=1, epoch=0):
    """Per rank, the micro-batches of one epoch."""
    cls = _token_balanced_class()
    ranks = []
    for rank in range(workers):
        sampler = cls(lengths, per_device * workers * accumulation, workers, accumulation, rank=rank, drop_last=False)
        sampler.set_epoch(epoch)
        ranks.append(list(sampler))
    return ranks


@pytest.mark.parametrize(
    ("rows", "per_device", "workers", "accumulation"), [(103, 4, 2, 1), (96, 2, 4, 3), (50, 8, 1, 2)]
)
def test_every_row_is_trained_once_per_epoch(rows, per_device, workers, accumulation):
    ranks = _epoch(_lengths(rows), per_device, workers, accumulation)
    seen = sorted(i for batches in ranks for batch in batches for i in batch)
    assert seen == list(range(rows))
    assert len({len(batches) for batches in ranks}) == 1  # every rank takes part in every step


def test_a_steps_rows_do_not_depend_on_the_number_of_workers():
    lengths = _lengths(64)
    [one] = _epoch(lengths, 8, 1)
    two = _epoch(lengths, 4, 2)
    for step, batch in enumerate(one):
        assert sorted(batch) == sorted(two[0][step] + two[1][step])
    assert [sorted(b) for b in one] != [sorted(b) for b in _epoch(lengths, 8, 1, epoch=1)[0]]  # reshuffled per epoch


def test_workers_get_about_the_same_tokens():
    lengths = _lengths(800)
    ranks = _epoch(lengths, 8, 2)
    busiest = mean = 0
    for step in zip(*ranks):
        tokens = [sum(lengths[i] for i in batch) for batch in step]
        busiest += max(tokens)
        mean += sum(tokens) / len(tokens)
    assert busiest / mean < 1.02
    # the same rows dealt 8 and 8 in drawing order (what `random` does) leave one worker ~10% busier
    dealt = [[batch[:8], batch[8:]] for batch in (sorted(a + b) for a, b in zip(*ranks))]
    random_busiest = sum(max(sum(lengths[i] for i in half) for half in pair) for pair in dealt)
    assert random_busiest / mean > 1.05
