"""`batch_tokens`: micro-batches cut by a token budget instead of a number of rows (SFT).

Rows of 200-2,000 tokens make batches of a fixed number of rows carry anything from a few hundred to many
thousand tokens: small ones leave the GPU's matmuls short, large ones set the memory peak. With `batch_tokens`
each micro-batch holds as many rows as fit in the budget, so every forward pass has about the same size.

What a step is stays what it was: `gradient_accumulation_steps` micro-batches per worker, the loss the mean over
the step's trained tokens (transformers' `num_items_in_batch`), every row once per epoch, `max_steps`, warm-up and
the schedule counted in optimizer steps. Only the number of rows in a step now follows their lengths.

The rows are grouped into micro-batches once, before training, and each epoch visits the groups in a new order
(like packing, which also keeps the rows it merged together). A fixed grouping keeps the number of steps per
epoch fixed: the Trainer counts them once, and a regrouping per epoch could make a later epoch longer (rows not
trained) or shorter.

Grouping, by the cost of a micro-batch:
- flat batches (padding-free; a GPU's default): a micro-batch costs its tokens. First-fit decreasing: the
  longest rows first, each into the first group with room, so long rows share a batch with short ones and the
  groups fill the budget; equal lengths are taken in a seeded random order.
- padded batches: a micro-batch costs rows x its longest row. The rows sorted by length, cut in order (rows of
  similar length together: the least padding).
With `pad_to_multiple_of` (a GPU's default for flat batches: 8) the collator pads a micro-batch up to a multiple:
the grouping counts that padding, so the padded micro-batch stays within the budget too.
A row longer than the budget (an image run's tiles can make one) gets a micro-batch of its own: nothing is
dropped. The number of groups depends only on the rows' lengths, so the driver counts the steps before training
(launch/steps.py) with the same function the sampler uses (recipes/sampling.py).
"""

from __future__ import annotations

import random

# A tile's vision-encoder work in language-model tokens: LFM2-VL's processor pads every tile (and thumbnail, and image
# that is not split) to 1,024 patches, so a tile costs the same whatever its size; SigLIP2 over 1,024 patches is about
# the language model over 256 tokens (LFM2-VL-450M: 86M x 1,024 vs 354M x 256 parameter-FLOPs).
TILE_TOKENS = 256


def token_budget_batches(
    lengths: list[int], budget: int, *, padded: bool, seed: int, multiple: int | None = None
) -> list[list[int]]:
    """The rows' indices grouped into micro-batches of at most `budget` tokens once padded to `multiple` (the
    collator's pad_to_multiple_of; see the module's docstring)."""
    if budget < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {budget}")
    multiple = max(1, multiple or 1)
    rng = random.Random(seed)
    ties = list(range(len(lengths)))
    rng.shuffle(ties)
    tie = {index: position for position, index in enumerate(ties)}
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], tie[i]))
    if padded:
        return _cut_in_order(order, lengths, budget, multiple)
    # a flat row of n tokens is padded to the next multiple: n fits where n rounded up does, i.e. n <= the budget
    # rounded down (a row alone may still pass the budget by its own padding when the budget is not a multiple)
    return _first_fit(order, lengths, max(1, budget // multiple * multiple))


def _cut_in_order(order: list[int], lengths: list[int], budget: int, multiple: int) -> list[list[int]]:
    """Padded batches, longest first: a batch's cost is rows x its first (longest) row, padded to the multiple."""
    batches: list[list[int]] = []
    for index in order:
        if batches and (len(batches[-1]) + 1) * -(-lengths[batches[-1][0]] // multiple) * multiple <= budget:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def _first_fit(order: list[int], lengths: list[int], budget: int) -> list[list[int]]:
    """First-fit decreasing with a segment tree over the groups' free room: the leftmost group with room for a row
    in O(log n) (a linear scan is quadratic in the rows)."""
    size = 1
    while size < max(1, len(order)):
        size *= 2
    room = [0] * (2 * size)  # room[node]: the most free tokens of a group below node (leaves: groups)
    batches: list[list[int]] = []
    for index in order:
        need = lengths[index]
        if need > budget or room[1] < need:  # no group has room: open one
            group = len(batches)
            batches.append([index])
            _set(room, size, group, max(0, budget - need))
            continue
        node = 1
        while node < size:  # down to the leftmost leaf with room
            node = 2 * node if room[2 * node] >= need else 2 * node + 1
        group = node - size
        batches[group].append(index)
        _set(room, size, group, room[node] - need)
    return batches


def _set(room: list[int], size: int, leaf: int, value: int) -> None:
    node = size + leaf
    room[node] = value
    node //= 2
    while node:
        room[node] = max(room[2 * node], room[2 * node + 1])
        node //= 2


def micro_batches_per_worker(groups: int, workers: int, drop_last: bool) -> int:
    """How many micro-batches each worker trains per epoch: every worker needs one at every micro-step, so on
    several workers the last round is topped up with groups from the epoch's start (or dropped: drop_last)."""
    if workers <= 1:
        return groups
    return groups // workers if drop_last else -(-groups // workers)


def row_costs(table) -> list[int]:
    """Each prepared row's cost for the grouping: its tokens, plus TILE_TOKENS per image tile. `table`: an Arrow
    table of prepared rows, or a datasets.Dataset in arrow format (read by column: no copy of the token ids)."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(table["input_ids"])
    if "image_tiles" in table.column_names:
        lengths = pc.add(lengths, pc.multiply(pc.fill_null(table["image_tiles"], 0), TILE_TOKENS))
    return lengths.to_pylist()
