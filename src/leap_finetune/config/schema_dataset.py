"""The `dataset:` block (each source of training rows, and how it is split and mixed) and `image_processor:` (how the
rows' images become tokens)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from leap_finetune.config.schema_base import StrictModel


class DatasetConfig(StrictModel):
    """Where the training rows come from and how they are split."""

    path: str = Field(
        min_length=1,
        description="A local file (.jsonl, .json, .parquet, .csv), a folder of such files, or a Hub dataset id.",
    )
    type: str | None = Field(
        default=None,
        description="Row format; defaults to the training type (`sft`: rows with a `messages` list).",
    )
    limit: int | None = Field(
        default=None,
        gt=0,
        description="Use only the first N rows of `path` (those rows are the dataset: each is validated).",
    )
    test_size: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Hold out this fraction (0-1) or this many rows (>= 1) for evaluation. Ignored when `val_path` is set.",
    )
    split: str = Field(default="train", description="Split to read from a Hub dataset.")
    subset: str | None = Field(
        default=None,
        description="Configuration (subset) of a Hub dataset; refused for a local file or folder (it has none).",
    )
    val_path: str | None = Field(
        default=None, min_length=1, description="A separate evaluation dataset (same formats as `path`)."
    )
    on_invalid: Literal["error", "skip"] = Field(
        default="error",
        description="`error`: stop and list invalid rows. `skip`: drop them, print why, and save them to dropped_rows.jsonl.",
    )
    weight: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="With several sources (`dataset:` as a list): this source's share of the training rows, relative "
        "to the other sources' weights (sampled with `seed`; a share above its rows repeats rows). Give every source a "
        "weight (a finite number > 0), or none.",
    )
    epochs: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="This source's rows per training epoch, as a multiple of its rows: 2 repeats each row twice, 0.5 "
        "takes half of them (sampled with `seed`). Not with `weight`.",
    )
    num_proc: int | None = Field(
        default=None,
        ge=1,
        description="Processes that check and tokenize the rows (at most the machine's cores); default: one per "
        "~2,000 rows, up to every core (Linux; one elsewhere).",
    )
    image_root: str | None = Field(
        default=None,
        min_length=1,
        description="Vision-language models: the folder relative image paths in the rows start from (default: the "
        "folder of the data file that names them).",
    )
    hold_out_tools: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Tool-calling data (sft, grpo): every row that names one of these tools (calls it, or lists it "
        "among its tool definitions) is left out of training and evaluation rows, and becomes the `unseen_tools` "
        "benchmark (metric tool_call): how well the model calls tools it never saw. A tool named in any source is "
        "held out of every source. See docs/tool-calling.md.",
    )
    augment_tools: bool | float = Field(
        default=False,
        description="SFT rows with tool definitions: show training rows their tools under other names (some "
        "arguments renamed, another order, reworded descriptions), their calls written to match, so that the model "
        "learns to read a tool list rather than memorise one. true: every such training row; a number in (0, 1]: "
        "that share of them (a different disguise per row); evaluation rows keep the real tools. GRPO episodes: "
        "environment.augment_tools. See docs/tool-calling.md.",
    )
    cache: bool = Field(
        default=True,
        description="Keep the prepared rows on disk ($LEAP_FINETUNE_CACHE, default ~/.cache/leap-finetune/prepared), "
        "keyed by everything they depend on: `run` after `validate` reads them instead of preparing again.",
    )

    @model_validator(mode="after")
    def check_mixing(self) -> DatasetConfig:
        if self.weight is not None and self.epochs is not None:
            raise ValueError(
                "give a source either weight (its share of the mix) or epochs (a multiple of its rows), not both"
            )
        return self

    @field_validator("hold_out_tools")
    @classmethod
    def check_hold_out_tools(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return value
        for name in value:
            if not name.strip():
                raise ValueError("a tool name is empty: give the function names of the tools to hold out")
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"a tool is named twice: {', '.join(repeated)}")
        return value

    @field_validator("augment_tools")
    @classmethod
    def check_augment_tools(cls, value: bool | float) -> bool | float:
        if not isinstance(value, bool) and not 0 < value <= 1:
            raise ValueError(f"expected true, false or the share of rows in (0, 1], got {value}")
        return value

    @field_validator("test_size")
    @classmethod
    def check_test_size(cls, value: float | None) -> float | None:
        if value is not None and value >= 1 and value != int(value):
            raise ValueError("a test_size >= 1 is a row count and must be a whole number (or use a fraction below 1)")
        return value


class ImageProcessorConfig(StrictModel):
    """Vision-language models: how images become tokens (LFM2-VL's image processor settings; unset keys keep the
    model's own). Used to count each row's image tokens while the rows are checked, to build the batches, and
    saved with the trained model so that inference sees images the same way."""

    min_image_tokens: int | None = Field(
        default=None, ge=1, description="Tokens of the smallest image (small images are scaled up to it)."
    )
    max_image_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Tokens of one tile or of an image that is not split (256 for LFM2-VL: a 512x512 tile). "
        "Lower it to make rows with images shorter.",
    )
    do_image_splitting: bool | None = Field(
        default=None, description="Split large images into tiles (plus a thumbnail); false: one resized image each."
    )
    min_tiles: int | None = Field(default=None, ge=1, description="Fewest tiles of a split image.")
    max_tiles: int | None = Field(
        default=None, ge=1, description="Most tiles of a split image (each up to max_image_tokens tokens)."
    )
    use_thumbnail: bool | None = Field(default=None, description="Add a thumbnail of the whole image to its tiles.")

    @model_validator(mode="after")
    def check_ranges(self) -> ImageProcessorConfig:
        for low, high in (("min_image_tokens", "max_image_tokens"), ("min_tiles", "max_tiles")):
            a, b = getattr(self, low), getattr(self, high)
            if a is not None and b is not None and a > b:
                raise ValueError(f"{low} ({a}) is larger than {high} ({b})")
        return self

    def settings(self) -> dict:
        return {k: v for k, v in self.model_dump().items() if v is not None}


def dataset_shorthand(value):
    """`dataset: PATH` (or a list with PATH items) as the mappings it stands for: `{path: PATH}`."""
    if isinstance(value, str):
        return {"path": value}
    if isinstance(value, list):
        return [{"path": item} if isinstance(item, str) else item for item in value]
    return value
