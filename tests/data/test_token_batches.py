"""`batch_tokens`' grouping (data/token_batches.py) and its sampler (recipes/sampling.py): every row once per epoch,
no micro-batch over the budget, a count that depends on the lengths only (the driver counts the steps with it),
groups that fill the budget, and on several workers every group dealt with the last round topped up."""

from __future__ import annotations

import math
import random

import pytest

from leap_finetune.data.token_batches import micro_batches_per_worker, token_budget_batches
from leap_finetune.recipes.sampling import _token_budget_class


def _lengths(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [int(min(2040, max(200, rng.lognormvariate(math.log(700), 0.6)))) for _ in range(n)]


def _cost(group: list[int], lengths: list[int], padded: bool, multiple: int = 1) -> int:
    """What the collator makes of the group: padded rows to the longest, a flat row of them all; then up to the
    multiple (pad_to_multiple_of)."""

    def up(n: int) -> int:
        return -(-n // multiple) * multiple

    return len(group) * up(max(lengths[i] for i in group)) if padded else up(sum(lengths[i] for i in group))


@pytest.mark.parametrize("multiple", [None, 8])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("budget", [2048, 8192, 16380])
def test_every_row_once_and_no_group_over_the_budget(padded, budget, multiple):
    """With pad_to_multiple_of (8: the GPU default for flat batches) the collator's padding counts too."""
    lengths = _lengths(700)
    groups = token_budget_batches(lengths, budget, padded=padded, seed=3, multiple=multiple)
    assert sorted(i for g in groups for i in g) == list(range(700))
    assert max(_cost(g, lengths, padded, multiple or 1) for g in groups) <= budget


def test_a_row_longer_than_the_budget_gets_a_group_of_its_own():
    lengths = [100, 5000, 300, 200]
    for padded in (False, True):
        groups = token_budget_batches(lengths, 1000, padded=padded, seed=0)
        assert [1] in groups and sorted(i for g in groups for i in g) == [0, 1, 2, 3]


def test_the_count_depends_on_the_lengths_only():
    """The driver counts the steps from the prepared rows; the trainer groups its shuffled dataset: both must agree."""
    lengths = _lengths(500)
    shuffled = lengths[:]
    random.Random(9).shuffle(shuffled)
    for padded in (False, True):
        counts = {
            len(token_budget_batches(rows, 8192, padded=padded, seed=s)) for rows in (lengths, shuffled) for s in (1, 2)
        }
        assert len(counts) == 1


def test_flat_groups_fill_the_budget():
    lengths = _lengths(2000)
    groups = token_budget_batches(lengths, 16384, padded=False, seed=0)
    assert sum(lengths) / (len(groups) * 16384) > 0.97  # first-fit decreasing: ~full micro-batches
    padded = token_budget_batches(lengths, 16384, padded=True, seed=0)
    assert sum(lengths) / (len(padded) * 16384) > 0.85  # sorted by length: little padding


def _epoch(groups_of, workers: int, accumulation: int = 1, epoch: int = 0, drop_last: bool = False):
    lengths, budget = groups_of
    ranks = []
    for rank in range(workers):
        sampler = _token_budget_class()(
            lengths=lengths,
            budget=budget,
            padded=False,
            dp_size=workers,
            grad_accum=accumulation,
            rank=rank,
            drop_last=drop_last,
            seed=42,
        )
        sampler.set_epoch(epoch)
        ranks.append(list(sampler))
        assert len(sampler) == len(ranks[-1])
    return ranks


def test_the_sampler_visits_every_group_once_per_epoch_in_a_new_order():
    lengths = _lengths(300)
    groups = token_budget_batches(lengths, 4096, padded=False, seed=42)
    [first] = _epoch((lengths, 4096), 1)
    [second] = _epoch((lengths, 4096), 1, epoch=1)
    as_sets = lambda batches: sorted(sorted(b) for b in batches)  # noqa: E731
    assert as_sets(first) == as_sets(second) == as_sets(groups)  # the same groups, every row once
    assert first != second  # visited in a new order


@pytest.mark.parametrize("workers", [2, 3])
def test_several_workers_get_equal_turns_and_the_last_round_is_topped_up(workers):
    lengths = _lengths(301)
    groups = token_budget_batches(lengths, 4096, padded=False, seed=42)
    ranks = _epoch((lengths, 4096), workers, accumulation=2)
    assert len({len(r) for r in ranks}) == 1 == len({len(r) for r in ranks})
    assert len(ranks[0]) == micro_batches_per_worker(len(groups), workers, drop_last=False)
    dealt = [sorted(b) for r in ranks for b in r]
    assert all(sorted(g) in dealt for g in groups)  # every group trained
    assert len(dealt) - len(groups) == (-len(groups)) % workers  # only the top-up repeats
    dropped = _epoch((lengths, 4096), workers, drop_last=True)
    assert sum(len(r) for r in dropped) == len(groups) - len(groups) % workers


@pytest.mark.parametrize(
    ("training", "named", "advice"),
    [
        ({"per_device_train_batch_size": 8, "max_length": 2048}, "per_device_train_batch_size 8", "global batch"),
        # the profile's per_device_train_batch_size is unused with batch_tokens (and validate refuses the user's)
        (
            {"per_device_train_batch_size": 4, "batch_tokens": 8192, "max_length": 2048},
            "batch_tokens 8192",
            "lower batch_tokens (raise gradient_accumulation_steps to keep the tokens per step)",
        ),
    ],
)
def test_out_of_memory_names_the_batch_setting_that_is_in_use(tmp_path, training, named, advice):
    from leap_finetune.errors import LeapError
    from leap_finetune.recipes.failures import disk_errors

    with pytest.raises(LeapError) as caught, disk_errors(tmp_path, None, training):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert named in caught.value.message and advice in caught.value.fix
    if "batch_tokens" in training:
        assert "per_device_train_batch_size" not in caught.value.format()
