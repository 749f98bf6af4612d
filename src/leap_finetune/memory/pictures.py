"""The pictures of a vision-language run (LFM2-VL) as its vision encoder sees them, for the memory estimate's vision
part (memory/estimate.py): how many a row has, and how many patches each is.

A picture here is what the encoder runs over: a tile, a thumbnail, or an image resized whole (data/images.py
`tile_grid`). transformers' Lfm2VlImageProcessor pads each to its most patches - max(max_image_tokens x
downsample_factor^2, (tile_size / encoder_patch_size)^2 when large images are split); leap-finetune cuts a batch's
pixels back to its largest picture before the encoder runs (models/vision.py trim_picture_padding). So a micro-batch
counts its pictures x the largest picture of the data (the prepared rows' `image_patches`, or the images' sizes),
or x the processor's most where the rows do not say. A 512x512 image with LFM2-VL's settings: one picture of 1,024
patches; a 256x256 one, 256.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# where the prepared rows keep their pictures: SFT counts each row's tiles (data/images.py ImageRow); GRPO's prompts
# and DPO's pairs keep their images' sources (data/grpo_rows.py, data/preference_tokens.py)
TILES_COLUMN = "image_tiles"
PATCHES_COLUMN = "image_patches"
SOURCE_COLUMNS = ("images", "image_sources")


@dataclass(frozen=True)
class RowTiles:
    """The prepared rows' pictures: the most of one row, and the most per token (a micro-batch of batch_tokens)."""

    most: int
    per_token: float
    patches: int  # of each picture as the encoder gets it: the data's largest picture (or the processor's most)
    counted: bool  # False: not counted from the rows (none at hand): one picture per row assumed

    def patches_in(self, rows: int, batch_tokens: int | None = None) -> int:
        """The patches of a micro-batch of `rows` rows (each row once per forward: DPO's pairs are 2 rows), or of
        `batch_tokens` tokens."""
        tiles = math.ceil(batch_tokens * self.per_token) if batch_tokens else rows * self.most
        return tiles * self.patches


def row_tiles(resolved, prepared=None) -> RowTiles | None:
    """The pictures of `prepared`'s training rows (None for a text run). Rows not at hand, or counted without
    tokens: one picture per row, and for batch_tokens one per min_image_tokens (the smallest image's tokens)."""
    if not resolved.vision:
        return None
    processor = image_processor_of(resolved)
    patches = padded_patches(processor)
    counted = _tiles_per_row(processor, prepared)
    if counted is None:
        return RowTiles(1, 1 / max(1, int(processor.min_image_tokens)), patches, counted=False)
    tiles, largest = counted
    if largest:  # (as trim_picture_padding cuts: up to whole steps of its patches)
        from leap_finetune.models.vision import PATCH_STEP

        patches = min(patches, -(-largest // PATCH_STEP) * PATCH_STEP)
    tokens = np.maximum(np.asarray(prepared.train.tokens_per_row, dtype=np.float64), 1)
    return RowTiles(int(tiles.max()), float((tiles / tokens).max()), patches, counted=True)


def padded_patches(processor) -> int:
    """The patches every picture is padded to (Lfm2VlImageProcessor's max_num_patches, as its _preprocess makes it)."""
    whole = processor.max_image_tokens * processor.downsample_factor**2
    tile = (processor.tile_size // processor.encoder_patch_size) ** 2 if processor.do_image_splitting else 0
    return max(whole, tile)


def _tiles_per_row(processor, prepared) -> tuple[np.ndarray, int] | None:
    """(pictures per row, patches of the data's largest picture - 0 where the rows do not say)."""
    if prepared is None or not getattr(prepared, "tokenized", False) or len(prepared.train) == 0:
        return None
    table = prepared.train.table
    if TILES_COLUMN in table.column_names:
        tiles = table.column(TILES_COLUMN).to_numpy(zero_copy_only=False).astype(np.int64)
        if PATCHES_COLUMN not in table.column_names:  # (rows prepared before the column existed)
            return tiles, 0
        return tiles, int(np.nan_to_num(table.column(PATCHES_COLUMN).to_numpy(zero_copy_only=False)).max())
    column = next((name for name in SOURCE_COLUMNS if name in table.column_names), None)
    if column is None:
        return None
    from leap_finetune.data.images import ImageProblem, image_size, picture_patches, tile_grid

    seen: dict[str, tuple[int, int]] = {}
    try:  # (each image's header once: its size decides its tiles and its pictures' patches)
        for source in {s for row in table.column(column).to_pylist() for s in row or []}:
            size = image_size(source)
            seen[source] = tile_grid(processor, *size)[2], picture_patches(processor, *size)
    except ImageProblem:  # (moved since the rows were prepared: the run's data step says so; here, not counted)
        return None
    rows = table.column(column).to_pylist()
    tiles = np.array([sum(seen[s][0] for s in row or []) for row in rows], dtype=np.int64)
    return tiles, max((patches for _, patches in seen.values()), default=0)


def image_processor_of(resolved):
    """The run's image processor (its model's saved settings and the config's `image_processor:`), kept per model
    and settings: loaded from the model folder or the Hugging Face cache, never downloaded (transformers' defaults,
    LiquidAI's, when neither holds it)."""
    settings = resolved.image_processor.settings() if resolved.image_processor is not None else {}
    key = (resolved.model_id, repr(sorted(settings.items())))
    if key not in _processors:
        processor = _saved_processor(resolved.model_id)
        if settings:
            processor = type(processor).from_dict({**processor.to_dict(), **settings})
        _processors[key] = processor
    return _processors[key]


_processors: dict[tuple, object] = {}


def _saved_processor(model_id: str):
    from transformers import AutoImageProcessor, Lfm2VlImageProcessor

    from leap_finetune.models.tiny import TINY_IMAGE_PROCESSOR, TINY_MODELS

    if model_id in TINY_MODELS:
        return Lfm2VlImageProcessor(**TINY_IMAGE_PROCESSOR)
    try:
        saved = AutoImageProcessor.from_pretrained(model_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - not at hand (plan downloads nothing)
        return Lfm2VlImageProcessor()
    return saved if isinstance(saved, Lfm2VlImageProcessor) else Lfm2VlImageProcessor()
