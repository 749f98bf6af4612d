"""Which rows each worker trains on at each step (SFT's `train_sampling_strategy: batch_rebalance`, the default).

Every optimizer step draws its rows exactly as a random sampler would (a fresh permutation per epoch,
cut into global batches of per_device_train_batch_size x workers x gradient_accumulation_steps rows);
only the way those rows are dealt to the workers and accumulation micro-steps changes, so that each
gets about the same amount of work. Data-parallel workers wait for the slowest at every step: with
random dealing and rows of 200-2,000 tokens, 2 GPUs x 8 rows lose ~10% of their time waiting.

Because a step's rows do not depend on the number of workers, 1 worker x 8 rows and 2 workers x 4
rows train on the same rows in the same steps, and a run resumed with another number of workers
continues the same data order.

transformers' `BatchRebalanceSampler` does the drawing, the tail and the Trainer wiring (it is passed as
a batch sampler that accelerate does not re-shard). Its cost model is a padded batch
(rows x longest row, plus an attention term) over contiguous length groups; padding-free batches
(the default on a GPU) cost their token count instead, and a contiguous split balances those poorly
(measured on the benchmark's lengths: 91% of the ideal at 2 x 8 rows, vs 99% for the greedy dealing
below) - hence `TokenBalancedSampler`.
"""

from __future__ import annotations

import heapq

from leap_finetune.data.token_batches import micro_batches_per_worker, row_costs, token_budget_batches


def row_lengths(dataset) -> list[int]:
    """The cost of each row for the balance: its token count, read from the Arrow column (no Python copy of the
    token ids), plus TILE_TOKENS per image tile of an image run - so that the batches are grouped by tile count."""
    return row_costs(dataset.with_format("arrow"))


def balanced_sampler(args, dataset, *, padding_free: bool):
    """The batch sampler for `train_sampling_strategy: batch_rebalance` (see the module's docstring)."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    world_size = max(1, args.world_size)
    options = dict(
        lengths=row_lengths(dataset),
        effective_batch_size=args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size,
        dp_size=world_size,
        grad_accum=args.gradient_accumulation_steps,
        rank=args.process_index if world_size > 1 else 0,
        drop_last=args.dataloader_drop_last,
        seed=args.data_seed if args.data_seed is not None else args.seed,
    )
    if padding_free:
        return _token_balanced_class()(**options)
    return BatchRebalanceSampler(**options)


def token_budget_sampler(args, dataset, budget: int, *, padding_free: bool):
    """The batch sampler for `batch_tokens` (data/token_batches.py): micro-batches of at most `budget` tokens,
    grouped once, visited in a new order each epoch; on several workers each takes every n-th group of the order."""
    return _token_budget_class()(
        lengths=row_lengths(dataset),
        budget=budget,
        padded=not padding_free,
        dp_size=max(1, args.world_size),
        grad_accum=args.gradient_accumulation_steps,
        rank=args.process_index if args.world_size > 1 else 0,
        drop_last=args.dataloader_drop_last,
        seed=args.data_seed if args.data_seed is not None else args.seed,
        multiple=getattr(args, "pad_to_multiple_of", None),
    )


def _token_budget_class():
    import torch
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    class TokenBudgetSampler(BatchRebalanceSampler):
        """A BatchRebalanceSampler to the Trainer (passed as a batch sampler, not re-sharded by accelerate, given
        its epoch), with groups of its own."""

        def __init__(self, *, lengths, budget, padded, dp_size, grad_accum, rank, drop_last, seed, multiple=None):
            super().__init__(
                lengths=lengths,
                effective_batch_size=dp_size * grad_accum,
                dp_size=dp_size,
                grad_accum=grad_accum,
                seed=seed,
                rank=rank,
                drop_last=drop_last,
            )
            self.groups = token_budget_batches(lengths, budget, padded=padded, seed=seed, multiple=multiple)
            self.per_worker = micro_batches_per_worker(len(self.groups), dp_size, drop_last)

        def __iter__(self):
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.groups), generator=generator).tolist()
            wanted = self.per_worker * self.dp_size
            order = (order * -(-wanted // max(1, len(order))))[:wanted]  # (topped up from the start: see above)
            for position in range(self.rank, wanted, self.dp_size):
                yield self.groups[order[position]]

        def __len__(self):
            return self.per_worker

    return TokenBudgetSampler


def _token_balanced_class():
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    class TokenBalancedSampler(BatchRebalanceSampler):
        """Padding-free batches: a micro-batch costs its tokens. Rows go longest first to the group with
        the fewest tokens so far (greedy LPT), then groups are dealt to micro-steps as transformers does."""

        def _assign(self, indices, lengths):
            groups_count = self.dp_size * self.grad_accum
            groups: list[list[int]] = [[] for _ in range(groups_count)]
            heap = [(0, k) for k in range(groups_count)]
            # Ties broken by the row's position: every rank computes the same dealing.
            for _position, (index, length) in sorted(enumerate(zip(indices, lengths)), key=lambda p: (-p[1][1], p[0])):
                tokens, k = heapq.heappop(heap)
                groups[k].append(index)
                heapq.heappush(heap, (tokens + length, k))
            cost = dict((k, tokens) for tokens, k in heap)
            order = sorted(range(groups_count), key=lambda k: (-cost[k], k))
            # Slot s (micro-step s) takes the s-th block of dp_size groups: equal cost across ranks per slot.
            return [
                [groups[order[slot * self.dp_size + rank]] for slot in range(self.grad_accum)]
                for rank in range(self.dp_size)
            ]

    return TokenBalancedSampler


def epoch_callback():
    """A callback that gives the batch sampler its epoch at the start of every epoch, resumed ones included.

    transformers reaches a batch sampler's set_epoch through one wrapper (accelerate's BatchSamplerShard), but a
    resume in the middle of an epoch adds a second (accelerate's SkipBatchSampler): on several workers the
    resumed epoch then replayed epoch 0's order (measured: 2 Ray workers resumed at step 10 of 16, 8 steps per
    epoch, diverged from the uninterrupted run at step 11). The epoch is the trainer state's (whole epochs done)."""
    from transformers import TrainerCallback

    class SamplerEpoch(TrainerCallback):
        def __init__(self):
            self.sampler = None

        def on_epoch_begin(self, args, state, control, **kwargs):
            if self.sampler is not None:
                self.sampler.set_epoch(int(state.epoch or 0))

    return SamplerEpoch()
