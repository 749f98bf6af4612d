"""Vision-language models (LFM2-VL): recognising one before it loads, its processor, and images.

Benchmark rows with image parts go through the model's processor, which turns each `<image>` in
the rendered prompt into the image's tokens and the image into pixel values.
"""

from __future__ import annotations

from pathlib import Path

from leap_finetune.errors import LeapError
from leap_finetune.models.registry import VL_NAME, config_json
from leap_finetune.models.tiny import (
    TINY_MODELS,
    TINY_VISION_MODELS,
    build_tiny_processor,
)


def is_vision_model(model_id: str) -> bool:
    """True for a vision-language model, decided from its config.json without loading weights:
    a local folder's or the Hub cache's; without either, from the name (LiquidAI's LFM2-VL-*)."""
    if model_id in TINY_MODELS:
        return model_id in TINY_VISION_MODELS
    config = config_json(model_id)
    if config is not None:
        return "vision_config" in config
    return bool(VL_NAME.search(model_id))


def require_torchvision(model_id: str) -> None:
    """LFM2-VL's image processor is built on torchvision; say so before any model loads."""
    try:
        import torchvision  # noqa: F401
    except Exception as err:  # noqa: BLE001 - missing, or built for another torch
        raise LeapError(
            f"'{model_id}' is a vision-language model and its image processor needs torchvision, which cannot be "
            f"imported: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
            where="model_name",
            fix="install the torchvision built for your torch (torch 2.14.1 -> torchvision 0.29.1, torch 2.11 -> "
            "0.26), e.g. `pip install torchvision==0.29.1 pillow`",
        ) from None


def image_reader(resolved, tokenizer):
    """The run's images as its model sees them (data/images.py), with the config's `image_processor:` settings."""
    from leap_finetune.data.images import ImageReader

    settings = resolved.image_processor.settings() if resolved.image_processor is not None else {}
    return ImageReader(load_processor(resolved.model_id, tokenizer), settings)


def load_processor(model_id: str, tokenizer, settings: dict | None = None):
    """The model's processor, sharing the tokenizer leap-finetune renders with; `settings`: the config's
    `image_processor:` keys, applied to its image processor (what the trained model is saved with)."""
    processor = _load_processor(model_id, tokenizer)
    if settings:
        image_processor = processor.image_processor
        processor.image_processor = type(image_processor).from_dict({**image_processor.to_dict(), **settings})
    return processor


def _load_processor(model_id: str, tokenizer):
    require_torchvision(model_id)
    if model_id in TINY_MODELS:
        return build_tiny_processor(tokenizer)
    from transformers import AutoProcessor

    from leap_finetune.models.hub import download_kwargs

    try:
        processor = AutoProcessor.from_pretrained(model_id, **download_kwargs(model_id))
    except Exception as err:  # noqa: BLE001
        raise LeapError(
            f"cannot load the processor of '{model_id}': {str(err).splitlines()[0]}",
            where="model_name",
            fix="a vision-language model folder needs its processor files "
            "(preprocessor_config.json / processor_config.json)",
        ) from None
    processor.tokenizer = tokenizer
    return processor


def has_processor_files(model_id: str) -> bool:
    """False for a local folder without processor settings (a training checkpoint); Hub ids and
    built-in models are assumed to have them."""
    folder = Path(model_id)
    if not folder.is_dir():
        return True
    return any((folder / name).is_file() for name in ("processor_config.json", "preprocessor_config.json"))


def open_image(path: str):
    """An image file (or http(s) URL) as RGB."""
    from transformers.image_utils import load_image

    return load_image(path).convert("RGB")


def real_patches_only(model) -> bool:
    """A vision-language model's encoder over its pictures' real patches: each batch cut to its largest picture
    (trim_picture_padding), and the pictures packed into one sequence (models/packed_vision.py). True when the model
    has a vision encoder this applies to."""
    from leap_finetune.models.packed_vision import pack_vision_encoder

    trimmed = trim_picture_padding(model)
    return pack_vision_encoder(model) or trimmed


# The patches a picture is trimmed to come in steps of this many: every LFM2-VL image token is downsample_factor^2
# (4) patches, so a step of 16 keeps whole tokens, and few distinct shapes reach the encoder's kernels.
PATCH_STEP = 16


def trim_picture_padding(model) -> bool:
    """LFM2-VL's image processor pads every picture to its most patches (1,024 with LiquidAI's settings: a 256x256
    image uses 256 of them), and the vision encoder (SigLIP2) runs its layers over the padding too: the attention
    mask hides it from the result, not from the work or the memory. A forward pre-hook on the encoder cuts the
    batch's pixels to its longest picture (rounded up to PATCH_STEP) before every call - training, the reference,
    the sampler's prefill and evaluation alike. The encoder's output for each real patch is unchanged (tested); the
    projector reads only real patches. True when the hook was added (once per model)."""
    tower = getattr(getattr(model, "model", None), "vision_tower", None)
    if tower is None or getattr(tower, "_leap_trim_hook", False):
        return False
    tower.register_forward_pre_hook(_trim_padding, with_kwargs=True)
    tower._leap_trim_hook = True
    return True


def _trim_padding(module, args, kwargs):
    values, mask = kwargs.get("pixel_values"), kwargs.get("pixel_attention_mask")
    if args or values is None or mask is None or mask.dim() != 2 or values.dim() != 3 or mask.shape[0] == 0:
        return None  # (not the keyword call Lfm2VlModel.get_image_features makes: left as it is)
    longest = int(mask.sum(-1).max())  # (one wait for the device per encoder call; the shapes depend on it)
    keep = min(mask.shape[1], -(-longest // PATCH_STEP) * PATCH_STEP)
    if keep >= mask.shape[1]:
        return None
    return args, {**kwargs, "pixel_values": values[:, :keep], "pixel_attention_mask": mask[:, :keep]}
