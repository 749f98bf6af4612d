"""Images of a vision-language run (LFM2-VL): read, decoded, and counted in tokens before any model loads.

Every image of every row is opened and decoded while the rows are checked (a missing, truncated or unreadable
file is a row problem, not a crash at step 9,000), and the tokens it becomes are counted from its size with the
model's own processor settings: LFM2-VL resizes an image to a multiple of 32 pixels between min_image_tokens and
max_image_tokens, or splits a large one into 512-pixel tiles plus a thumbnail. The rendered text keeps one
`<image>` per image; the prepared token ids hold the image's full expansion (start, tile markers, the image
tokens, end), never trained, so `max_length` and the batches see the real length.

The expansion is computed from the image's size alone (the processor's `smart_resize`, `_is_image_too_large`,
`_get_grid_layout` and `_build_image_tokens`, all integer arithmetic): no pixels are resized while the rows are
prepared. tests/data/test_images.py checks it against the processor's own output for sizes that resize, split
and tile. The pixels are made per batch by the processor (recipes/vision.py).
"""

from __future__ import annotations

import binascii
import io
import warnings
from dataclasses import dataclass, field

import numpy as np

from leap_finetune.data.messages import IMAGE_PLACEHOLDER, ImageRef, b64decode, looks_base64
from leap_finetune.data.render import IGNORE_INDEX, CompactRow, Renderer, TokenizedRow, tokenize_many
from leap_finetune.errors import LeapError

# what Pillow opens that LFM2-VL's processor reads as RGB
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


class ImageProblem(Exception):
    """What is wrong with one image, in the words a row problem uses."""


@dataclass(frozen=True)
class ImageLayout:
    tiles: int  # pictures the vision encoder sees: the tiles and the thumbnail, or 1
    ids: tuple[int, ...]  # the tokens that replace the image's `<image>`
    patches: int = 0  # of its largest picture (the vision encoder's work per picture: models/vision.py)


def read_bytes(source: str) -> bytes:
    """The encoded image: a file's bytes, or a data URI's / base64 text's decoded payload."""
    if source.startswith(("http://", "https://")):
        raise ImageProblem(
            f"an image given by URL ({source[:80]}): training reads every image at every epoch, so images must be "
            "local; download them and give the paths (or data URIs)"
        )
    if source.startswith("data:") or looks_base64(source):
        payload = source.partition(",")[2] if source.startswith("data:") else source
        try:
            return b64decode("".join(payload.split()))
        except (binascii.Error, ValueError) as err:
            raise ImageProblem(f"the image's base64 text does not decode ({err})") from None
    try:
        with open(source, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise ImageProblem(f"image file not found: {source}") from None
    except IsADirectoryError:
        raise ImageProblem(f"{source} is a folder, not an image file: give the path of one image") from None
    except OSError as err:
        raise ImageProblem(f"cannot read image file {source}: {err.strerror or err}") from None


def open_image(source: str, *, decode: bool = True):
    """The image as RGB (decoded in full: a truncated file fails here), or only its header with decode=False."""
    from PIL import Image, UnidentifiedImageError

    where = _shown(source)
    data = read_bytes(source)
    try:
        with warnings.catch_warnings():
            # (Pillow only warns between MAX_IMAGE_PIXELS and twice it: a warning with no row named, then a slow
            # decode of hundreds of MB; an invalid row like the larger ones instead)
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
        if image.format not in FORMATS:
            raise ImageProblem(f"{where} is a {image.format} image; supported: {', '.join(FORMATS)}")
        if decode:
            image.load()
            image = image.convert("RGB")
    except UnidentifiedImageError:
        raise ImageProblem(
            f"{where} is not an image Pillow can read (expected {', '.join(FORMATS)}; {len(data)} bytes)"
        ) from None
    except ImageProblem:
        raise
    except Image.DecompressionBombWarning:
        raise ImageProblem(
            f"{where} is over Pillow's safe size ({Image.MAX_IMAGE_PIXELS:,} pixels); resize it (the vision encoder "
            "sees at most a few 512x512 tiles of it anyway)"
        ) from None
    except Image.DecompressionBombError as err:  # (an Exception of its own, not an OSError)
        raise ImageProblem(
            f"{where} is larger than Pillow opens ({err}); resize it (the vision encoder sees at most a few 512x512 "
            "tiles of it anyway)"
        ) from None
    except (OSError, ValueError, SyntaxError) as err:  # Pillow's words for a truncated or corrupt file
        raise ImageProblem(f"{where} cannot be decoded: {err} (a truncated or corrupt file?)") from None
    if min(image.size) < 1:
        raise ImageProblem(f"{where} is empty ({image.size[0]}x{image.size[1]} pixels)")
    return image


def _shown(source: str) -> str:
    if source.startswith("data:"):
        return "the inline image (data URI or image bytes)"
    return "the inline image (base64 text)" if len(source) > 300 else source


def image_size(source: str) -> tuple[int, int]:
    """(width, height) from the header only (the rows were decoded in full when checked)."""
    if not source.startswith(("data:", "http://", "https://")) and not looks_base64(source):
        from PIL import Image

        try:
            with Image.open(source) as image:  # (reads the header, not the file)
                return image.size
        except Exception:  # noqa: BLE001 - said in the words of open_image below
            pass
    return open_image(source, decode=False).size


def tile_grid(image_processor, width: int, height: int) -> tuple[int, int, int]:
    """(rows, columns, tiles) of an image of this size as LFM2-VL's image processor cuts it: a large image into
    tile_size tiles (plus a thumbnail), else resized whole (1, 1, 1). `tiles`: the pictures the vision encoder sees
    (memory/pictures.py counts its work by them)."""
    ip = image_processor
    min_tiles, max_tiles = (ip.min_tiles, ip.max_tiles) if ip.do_image_splitting else (1, 1)
    large = ip._is_image_too_large(
        height, width, ip.max_image_tokens, ip.encoder_patch_size, ip.downsample_factor, ip.max_pixels_tolerance
    )
    if not large or min_tiles == max_tiles == 1:
        return 1, 1, 1
    cols, rows, *_ = ip._get_grid_layout(height, width, min_tiles, max_tiles, ip.tile_size)
    return rows, cols, rows * cols + (1 if ip.use_thumbnail and rows * cols != 1 else 0)


def picture_patches(image_processor, width: int, height: int) -> int:
    """The encoder patches of the largest picture an image of this size becomes: the image resized whole, or when it
    is split, a tile (tile_size / patch size, squared) or the thumbnail (the image resized whole) if larger."""
    ip = image_processor
    new_width, new_height = ip.smart_resize(
        height, width, ip.downsample_factor, ip.min_image_tokens, ip.max_image_tokens, ip.encoder_patch_size
    )
    whole = (new_width // ip.encoder_patch_size) * (new_height // ip.encoder_patch_size)
    if tile_grid(ip, width, height)[2] == 1:
        return whole
    return max((ip.tile_size // ip.encoder_patch_size) ** 2, whole if ip.use_thumbnail else 0)


class ImageReader:
    """A vision-language model's images as the model sees them: the processor (with the config's
    `image_processor:` settings applied) turns each into tokens here and into pixels per batch."""

    def __init__(self, processor, settings: dict | None = None):
        self.settings = dict(settings or {})
        image_processor = processor.image_processor
        if self.settings:
            image_processor = type(image_processor).from_dict({**image_processor.to_dict(), **self.settings})
            processor.image_processor = image_processor
        self.processor = processor
        self.image_processor = image_processor
        self.tokenizer = processor.tokenizer
        self.image_token_id = int(self.tokenizer.convert_tokens_to_ids(IMAGE_PLACEHOLDER))
        self._layouts: dict[tuple[int, int], ImageLayout] = {}  # (a plain dict: the reader pickles to spawned workers)
        ip = image_processor
        for low, high in (("min_image_tokens", "max_image_tokens"), ("min_tiles", "max_tiles")):
            if getattr(ip, low) > getattr(ip, high):
                raise LeapError(
                    f"image_processor: {low} {getattr(ip, low)} is larger than {high} {getattr(ip, high)} (the "
                    "model's own setting where the config leaves one out)",
                    where="image_processor",
                    fix=f"set both {low} and {high}, with {low} <= {high}",
                )

    def describe(self) -> dict:
        """The settings that decide each image's tokens (part of the data cache's key)."""
        ip = self.image_processor
        keys = ("min_image_tokens", "max_image_tokens", "do_image_splitting", "min_tiles", "max_tiles", "tile_size")
        keys += ("use_thumbnail", "encoder_patch_size", "downsample_factor", "max_pixels_tolerance")
        return {key: getattr(ip, key, None) for key in keys}

    def check(self, ref: ImageRef) -> tuple[int, int]:
        """Decode the image in full; its (width, height)."""
        return open_image(ref.source).size

    def size(self, source: str) -> tuple[int, int]:
        """(width, height) from the header only."""
        return image_size(source)

    def layout(self, width: int, height: int) -> ImageLayout:
        key = (width, height)
        if key not in self._layouts:
            self._layouts[key] = self._compute_layout(width, height)
        return self._layouts[key]

    def _compute_layout(self, width: int, height: int) -> ImageLayout:
        ip, processor = self.image_processor, self.processor
        new_width, new_height = ip.smart_resize(
            height, width, ip.downsample_factor, ip.min_image_tokens, ip.max_image_tokens, ip.encoder_patch_size
        )
        rows, cols, tiles = tile_grid(ip, width, height)
        per_tile, for_image = processor._get_image_num_tokens([new_height, new_width])
        text = processor._build_image_tokens(rows, cols, per_tile, for_image, ip.use_thumbnail, True)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ImageLayout(tiles, tuple(ids), picture_patches(ip, width, height))

    def pixels(self, sources: list[str]) -> dict:
        """The batch's pixel inputs (pixel_values, pixel_attention_mask, spatial_shapes), images in order."""
        return self.pixels_of([open_image(source) for source in sources])

    def pixels_of(self, images: list) -> dict:
        """Pixel inputs of decoded (RGB) images."""
        return dict(self.image_processor(images, return_tensors="pt"))


@dataclass
class ImageRow(CompactRow):
    """An SFT row of an image run, as training keeps it: the expanded ids, and the images in order (a row without
    images has none)."""

    images: list[str] = field(default_factory=list)
    image_tokens: list[int] = field(default_factory=list)  # per image
    tiles: int = 0
    patches: int = 0  # of the row's largest picture

    def columns(self) -> dict:
        return {
            **super().columns(),
            "image_sources": self.images,
            "image_tokens": self.image_tokens,
            "image_tiles": self.tiles,  # (the batch balance counts the vision encoder's work: recipes/sampling.py)
            "image_patches": self.patches,  # (the memory estimate: memory/pictures.py)
        }


class VisionRenderer(Renderer):
    """The Renderer of a vision-language run: rows with images are expanded to the image tokens and never cut
    (cutting inside an image breaks the model's input); a row that does not fit max_length is a row problem,
    found when the rows are checked. Rows without images are rendered as text rows are."""

    def __init__(self, tokenizer, template, loss_on, max_length, truncation_mode="keep_start", *, reader):
        super().__init__(tokenizer, template, loss_on, max_length, truncation_mode)
        self.reader = reader

    def expand(self, row: TokenizedRow, sizes: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, list]:
        """(ids, labels, layouts): each `<image>` of the rendered row replaced by its image's tokens (no loss)."""
        ids = np.asarray(row.input_ids, dtype=np.int64)
        labels = np.asarray(row.labels, dtype=np.int64)
        at = np.flatnonzero(ids == self.reader.image_token_id)
        if len(at) != len(sizes):
            raise ImageProblem(
                f"the rendered row has {len(at)} image token(s) for {len(sizes)} image(s): the chat template "
                f"dropped or repeated an image part"
            )
        layouts = [self.reader.layout(w, h) for w, h in sizes]
        id_parts, label_parts, start = [], [], 0
        for position, layout in zip(at, layouts, strict=True):
            id_parts += [ids[start:position], np.asarray(layout.ids, dtype=np.int64)]
            label_parts += [labels[start:position], np.full(len(layout.ids), IGNORE_INDEX, dtype=np.int64)]
            start = position + 1
        id_parts.append(ids[start:])
        label_parts.append(labels[start:])
        return np.concatenate(id_parts), np.concatenate(label_parts), layouts

    def tokenize_images(self, conversation, sizes: list[tuple[int, int]]) -> tuple[TokenizedRow, ImageRow]:
        """The row in full (for `inspect`: the text keeps one `<image>` per image) and as training keeps it."""
        row = self.tokenize(conversation.messages, conversation.tools, truncate=False)
        ids, labels, layouts = self.expand(row, sizes)
        row.meta["images"] = [
            {"image": _shown(ref.source), "size": f"{w}x{h}", "tiles": layout.tiles, "tokens": len(layout.ids)}
            for ref, (w, h), layout in zip(conversation.images, sizes, layouts, strict=True)
        ]
        row.meta["tokens"] = len(ids)
        image_row = ImageRow(
            ids.astype(np.int32),
            labels.astype(np.int32),
            trained_tokens_lost=0,
            truncated=False,
            images=[ref.source for ref in conversation.images],
            image_tokens=[len(layout.ids) for layout in layouts],
            tiles=sum(layout.tiles for layout in layouts),
            patches=max((layout.patches for layout in layouts), default=0),
        )
        return row, image_row

    def expand_pair(self, pair, sizes: list[tuple[int, int]]) -> None:
        """A DPO pair (data/preference_tokens.TokenizedPair): the prompt's `<image>`s expanded in place, and the
        images recorded (the completions never hold images)."""
        prompt = TokenizedRow("", list(pair.prompt_ids), list(pair.prompt_ids), [])
        ids, _, layouts = self.expand(prompt, sizes)
        pair.prompt_ids = ids.tolist()
        pair.images = list(pair.images or [])
        pair.image_tokens = [len(layout.ids) for layout in layouts]
        pair.meta["images"] = [
            {"image": _shown(source), "size": f"{w}x{h}", "tiles": layout.tiles, "tokens": len(layout.ids)}
            for source, (w, h), layout in zip(pair.images, sizes, layouts, strict=True)
        ]

    def fits(self, row, sizes: list[tuple[int, int]]) -> str | None:
        """None when the row (a conversation, or a DPO pair) with its images fits max_length; else what to tell
        the user."""
        if self.max_length is None or hasattr(row, "solution"):  # (a GRPO prompt is kept whole: never cut)
            return None
        if hasattr(row, "chosen"):  # a DPO pair: the prompt with the longer completion
            from leap_finetune.data.preference_tokens import tokenize_pair

            pair = tokenize_pair(self, row)
            self.expand_pair(pair, sizes)
            tokens = len(pair.prompt_ids) + max(len(pair.chosen_ids), len(pair.rejected_ids))
            image_tokens, tiles = sum(pair.image_tokens), sum(m["tiles"] for m in pair.meta["images"])
        else:
            _, image_row = self.tokenize_images(row, sizes)
            tokens, image_tokens, tiles = image_row.tokens, sum(image_row.image_tokens), image_row.tiles
        if tokens <= self.max_length:
            return None
        return (
            f"{tokens} tokens with its {len(sizes)} image(s) ({image_tokens} image tokens, "
            f"{tiles} tile(s)) > max_length {self.max_length}; a row with images is never cut (a cut "
            "image breaks the model's input): lower image_processor.max_image_tokens / max_tiles, raise "
            "training_config.max_length, or set dataset.on_invalid: skip"
        )


def image_sizes(renderer: VisionRenderer, images) -> list[tuple[int, int]]:
    """(width, height) of each image from its header (pass 1 decoded each in full). An image that no longer reads
    changed since pass 1: an error of the data step."""
    try:
        return [renderer.reader.size(ref.source) for ref in images]
    except ImageProblem as err:
        raise LeapError(
            f"an image changed while the rows were prepared: {err}",
            where=images[0].field,
            fix="leave the images in place while leap-finetune prepares the rows, and run again",
        ) from None


def vision_rows(renderer: VisionRenderer, conversations: list) -> list[ImageRow]:
    """Every row of an image run with the same columns: rows without images as text rows are (cut at
    max_length), with an empty list of images."""
    rows = []
    for conversation in conversations:
        if conversation.images:
            rows.append(renderer.tokenize_images(conversation, image_sizes(renderer, conversation.images))[1])
            continue
        text = tokenize_many(renderer, [conversation])[0]
        rows.append(ImageRow(text.input_ids, text.labels, text.trained_tokens_lost, text.truncated))
    return rows
