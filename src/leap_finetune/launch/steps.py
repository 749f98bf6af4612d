"""How many optimizer steps a run has, counted the way its trainer counts them: what `plan` and the run's
`run:` line say, and the note on the rows that do not fill the last step of an epoch.

Every training type but GRPO takes `per_device_train_batch_size` x accumulation x workers rows per step. GRPO's
batch counts completions, not prompts: TRL's `RepeatSampler` (trl 1.16, trainer/utils.py) cuts the prompts into
generation batches of `generation_batch_size / num_generations` prompts, drops the last one when it is not
whole, and repeats each prompt `num_generations` times and each generation batch `num_iterations x
steps_per_generation` times; the dataloader hands out `per_device_train_batch_size x steps_per_generation`
completions per worker at a time, and every `gradient_accumulation_steps` of them make an optimizer step
(transformers' Trainer: ceil(batches / accumulation), at least 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from leap_finetune.data.token_batches import TILE_TOKENS, micro_batches_per_worker, row_costs, token_budget_batches
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of

# per_device_train_batch_size where nothing sets it: transformers' TrainingArguments default, which TRL's configs
# keep (SFTConfig, DPOConfig, KTOConfig, GRPOConfig: trl 1.16)
TRL_BATCH_SIZE = 8


def per_device_rows(training: dict) -> int:
    """Rows (GRPO: completions) per device per micro-batch, as the trainer takes them."""
    return training.get("per_device_train_batch_size", TRL_BATCH_SIZE)


def accumulation(training: dict) -> int:
    return training.get("gradient_accumulation_steps", 1)


@dataclass(frozen=True)
class EpochSteps:
    per_step: int  # samples per optimizer step: rows, or GRPO's completions
    unit: str  # "rows" | "completions"
    steps_per_epoch: int
    last_batch: str | None  # what happens to the rows that do not fill the epoch's last step
    per_step_detail: str = ""  # GRPO: how prompts become the completions of a step
    approximate: bool = False  # batch_tokens: per_step is the mean number of rows of a step

    def total(self, training: dict) -> int:
        """max_steps, else num_train_epochs x steps per epoch rounded up (transformers' Trainer)."""
        steps = training.get("max_steps", -1)
        if steps is not None and steps > 0:
            return steps
        return math.ceil(training.get("num_train_epochs", 1) * self.steps_per_epoch)


def epoch_steps(
    resolved, rows: int, workers: int, lengths: list[int] | None = None, gpu: bool = False, tiled: bool = False
) -> EpochSteps:
    """The steps of one epoch of `rows` training rows (GRPO: prompts) on `workers` workers. GRPO prompts that
    fill no generation batch at all are an error: TRL would train nothing (a ValueError without max_steps, a run
    that stops at step 0 with it). `lengths`: each row's cost (data/token_batches.row_costs), which `batch_tokens`
    needs to count its micro-batches, and `gpu` (padding-free or padded batches group differently). `tiled`: some
    image of the rows is cut into tiles (fewer tiles would shorten it)."""
    t = resolved.training
    if method_of(resolved).rewards:
        return _grpo_steps(t, rows, workers, resolved.config_path or "config")
    if t.get("batch_tokens"):
        return _token_budget_steps(resolved, rows, workers, lengths, gpu, tiled)
    per_step = per_device_rows(t) * accumulation(t) * workers
    return EpochSteps(per_step, "rows", math.ceil(rows / per_step), last_batch_note(t, rows, per_step, workers))


def prepared_steps(resolved, prepared, devices) -> EpochSteps:
    """epoch_steps of the prepared training rows on the device plan's workers (with the rows' lengths when
    `batch_tokens` needs them and the rows were tokenized). The checks and the run's line ask for the same count:
    the last answer is kept (grouping a million rows by batch_tokens takes ~10 s)."""
    last, counted = _last_counted
    if (
        last is not None
        and last[0] is prepared
        and last[1] is resolved
        and last[2:] == (devices.workers, devices.use_gpu)
    ):
        return counted  # (the objects themselves are kept: an id is not reused while they live)
    table = prepared.train.table
    lengths, tiled = None, False
    if resolved.training.get("batch_tokens") and prepared.tokenized and "input_ids" in table.column_names:
        lengths = row_costs(table)
        tiled = _tiled(table)
    counted = epoch_steps(resolved, len(prepared.train), devices.workers, lengths, gpu=devices.use_gpu, tiled=tiled)
    _last_counted[:] = [(prepared, resolved, devices.workers, devices.use_gpu), counted]
    return counted


_last_counted: list = [None, None]  # (the objects asked about, their EpochSteps): see prepared_steps


def _tiled(table) -> bool:
    """Whether an image of the prepared rows is cut into tiles (a row has more encoder pictures than images)."""
    if "image_tiles" not in table.column_names or "image_sources" not in table.column_names:
        return False
    import pyarrow.compute as pc

    tiles = pc.fill_null(table["image_tiles"], 0)
    images = pc.fill_null(pc.list_value_length(table["image_sources"]), 0)
    return bool(pc.any(pc.greater(tiles, images)).as_py())


def _one_row_note(lengths: list[int], budget: int, images: bool, tiled: bool = False) -> str:
    """What batch_tokens does when rows do not share micro-batches (rows over the budget, or every micro-batch one
    row), and the advice that works: rows with images are never cut, so max_length cannot shorten them; fewer tiles
    only where an image is cut into several (one picture per image is the least; max_tiles: 1 alone is refused, as
    the default min_tiles 2 is larger)."""
    import statistics

    over = sum(length > budget for length in lengths)
    cost = "tokens" + (f", each image tile counted as {TILE_TOKENS} for the vision encoder's work" if images else "")
    if over:
        said = (
            f"batch_tokens: {over} row(s) cost more than batch_tokens {budget} (the most {max(lengths)} {cost}): "
            "each is a micro-batch of its own, over the budget"
        )
    else:
        said = (
            f"batch_tokens {budget}: every micro-batch holds one row (rows cost {min(lengths)}-{max(lengths)} {cost}), "
            "so batch_tokens does no grouping"
        )
    two = 2 * int(statistics.median(lengths))
    raise_it = f"raise batch_tokens to >= {two} for two typical rows per micro-batch"
    if not images:
        advice = f"{raise_it}, or set max_length to cut rows"
    elif tiled:
        advice = (
            f"{raise_it}, or cut images into fewer tiles (a lower image_processor.max_tiles, with min_tiles at most "
            "it, or do_image_splitting: false); max_length cannot shorten them (a row with images is never cut)"
        )
    else:  # (each image is one picture already: fewer tiles cannot shorten the rows)
        advice = f"{raise_it}; max_length cannot shorten them (a row with images is never cut)"
    return f"{said}: {advice}"
    return f"{said}: {advice}"


def _token_budget_steps(
    resolved, rows: int, workers: int, lengths: list[int] | None, gpu: bool, tiled: bool = False
) -> EpochSteps:
    """`batch_tokens`: the micro-batches are counted by grouping the rows exactly as the trainer's sampler will
    (the count depends on the lengths only). Without the lengths (rows counted without a tokenizer) the steps are
    bounded by one row per micro-batch."""
    t = resolved.training
    accumulated = accumulation(t)
    budget = t["batch_tokens"]
    if lengths is None:
        groups = rows
    else:
        from leap_finetune.recipes.sft import speed_plan

        plan = speed_plan(resolved, cuda=gpu)  # (the trainer's choices: recipes/sft.py)
        multiple = (
            t["pad_to_multiple_of"] if "pad_to_multiple_of" in t else plan.trainer_defaults.get("pad_to_multiple_of")
        )
        seed = t.get("data_seed") if t.get("data_seed") is not None else t.get("seed", 42)
        groups = len(token_budget_batches(lengths, budget, padded=not plan.padding_free, seed=seed, multiple=multiple))
    per_worker = micro_batches_per_worker(groups, workers, bool(t.get("dataloader_drop_last")))
    if per_worker == 0 and rows:
        raise LeapError(
            f"batch_tokens {budget} groups the {rows} training rows into {groups} micro-batch(es), fewer than the "
            f"{workers} workers, and dataloader_drop_last: true drops them all: nothing would be trained",
            where=resolved.config_path or "training_config",
            fix="remove dataloader_drop_last, lower batch_tokens, or train on fewer workers",
        )
    steps = max(1, math.ceil(per_worker / accumulated))
    per_step = max(1, round(rows / steps)) if rows else 0
    left = per_worker * workers - groups
    note = None
    if lengths is None:
        note = (
            f"steps: at most {steps} per epoch - the rows were counted without their lengths (not tokenized here), "
            "one row per micro-batch; `run` groups them by batch_tokens and prints the exact count"
        )
    elif any(length > budget for length in lengths) or (groups == rows > 1):
        note = _one_row_note(lengths, budget, images=resolved.vision, tiled=tiled)
    elif left > 0:
        note = (
            f"last batch: {groups} micro-batches of <= {budget} tokens per epoch on {workers} workers: the last "
            f"round is topped up with {left} micro-batch(es) from the epoch's start (every worker gets one)"
        )
    elif left < 0:
        note = f"last batch: dataloader_drop_last is true: {-left} micro-batch(es) per epoch are not trained on"
    return EpochSteps(per_step, "rows", steps, note, f"micro-batches of <= {budget} tokens: batch_tokens", True)


def _grpo_steps(t: dict, prompts: int, workers: int, where: str) -> EpochSteps:
    per_device, accumulated = per_device_rows(t), accumulation(t)
    generations = t.get("num_generations", 8)
    iterations = t.get("num_iterations", 1)
    # GRPOConfig.__post_init__: one of generation_batch_size / steps_per_generation decides the other
    completions = t.get("generation_batch_size")
    per_generation = t.get("steps_per_generation") or (
        completions // (per_device * workers) if completions else accumulated
    )
    completions = completions or per_device * workers * per_generation
    prompts_per_generation = completions // generations
    whole = prompts // prompts_per_generation  # RepeatSampler keeps whole generation batches only
    if not whole:
        raise LeapError(
            f"the training data has {prompts} prompt(s), fewer than one generation batch of "
            f"{prompts_per_generation} prompts ({completions} completions / num_generations {generations}): "
            "TRL trains on whole generation batches only, so nothing would be trained",
            where=where,
            fix=f"add prompts (at least {prompts_per_generation}), or lower per_device_train_batch_size, "
            "gradient_accumulation_steps (or generation_batch_size) or the workers, or raise num_generations",
        )
    batches = whole * iterations * per_generation  # the dataloader's batches per worker
    steps = math.ceil(batches / accumulated)
    per_step = per_device * accumulated * workers
    left = prompts % prompts_per_generation
    which = (
        "other prompts each epoch (shuffle_dataset)"
        if t.get("shuffle_dataset", True)
        else "the data's last prompts every epoch (shuffle_dataset: false)"
    )
    note = (
        (
            f"last batch: {left} prompt(s) per epoch do not fill a generation batch of {prompts_per_generation} "
            f"prompts and are not trained on: TRL's sampler takes whole generation batches only ({which})"
        )
        if left
        else None
    )
    prompts_per_step = per_step // generations
    detail = (
        f"{prompts_per_step} prompt{'s' if prompts_per_step > 1 else ''} x {generations} generations"
        if per_step % generations == 0
        else f"{generations} generations per prompt"
    )
    if iterations > 1:
        detail += f"; each generation batch trained {iterations} times (num_iterations)"
    return EpochSteps(per_step, "completions", steps, note, detail)


def last_batch_note(training: dict, rows: int, per_step: int, workers: int) -> str | None:
    """What happens to the rows that do not fill the last step of an epoch (nothing is dropped)."""
    left = rows % per_step
    if not left or training.get("packing"):
        return None
    if training.get("dataloader_drop_last"):
        return f"last batch: dataloader_drop_last is true: {left} row(s) per epoch are not trained on"
    groups = workers * accumulation(training)
    if training.get("train_sampling_strategy", "random") == "batch_rebalance":
        topped = f", topped up to {groups} with rows from the epoch's start" if left < groups else ""
        return f"last batch: the last step of each epoch trains the {left} remaining row(s){topped}"
    if workers > 1:
        return (
            f"last batch: the last step of each epoch trains the {left} remaining row(s), topped up to "
            f"{per_step} with rows from the epoch's start (every worker gets a full batch)"
        )
    return f"last batch: the last step of each epoch trains the {left} remaining row(s)"
