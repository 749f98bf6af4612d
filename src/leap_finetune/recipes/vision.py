"""Training a vision-language model (LFM2-VL) on rows with images: the parts that train, the vision encoder's
learning rate, and the batches' pixels.

- Parts: `train_vision_encoder`, `train_projector`, `train_language_model` (training_config; resolved by
  validate/vision.py). A full fine-tune freezes the parts set to false; with LoRA the adapters sit on the language
  model and a part set to true is trained in full and saved with the adapter (peft's modules_to_save).
- Learning rate: the vision encoder's parameters get their own optimizer groups at learning_rate x
  `vision_encoder_lr_multiplier` (split from the Trainer's own groups, so weight decay and the schedule apply).
- Batches: the prepared rows hold the expanded image tokens and each image's source (`image_sources`); the
  collator pads the text as TRL's does (padding-free included: the images' features are scattered into the
  flattened sequence at the image tokens, row by row) and adds the pixels the processor makes, checking that each
  image still becomes the tokens the rows were prepared with.
"""

from __future__ import annotations

from leap_finetune.errors import LeapError
from leap_finetune.recipes.ranks import is_main_process

IMAGE_COLUMNS = ("image_sources", "image_tokens", "image_tiles", "image_patches")
VISION_ENCODER, PROJECTOR, LANGUAGE_MODEL = "vision_tower", "multi_modal_projector", "language_model"


def parts(model) -> dict:
    """The three parts of an LFM2-VL model (Lfm2VlForConditionalGeneration: model.vision_tower, ...); the LM head
    belongs to the language model (tied to its embeddings)."""
    inner = getattr(model, "model", None)
    found = {name: getattr(inner, name, None) for name in (VISION_ENCODER, PROJECTOR, LANGUAGE_MODEL)}
    missing = [name for name, module in found.items() if module is None]
    if missing:
        raise LeapError(
            f"the model ({type(model).__name__}) has no {', '.join(missing)}: leap-finetune knows the parts of LFM2-VL "
            "(vision_tower, multi_modal_projector, language_model)",
            where="model_name",
            fix="use an LFM2-VL model, or train it without the vision keys",
        )
    return found


def freeze_parts(model, training: dict) -> dict[str, int]:
    """A full fine-tune: parts set to false stop training. Returns trainable parameters per part."""
    found = parts(model)
    wanted = {
        VISION_ENCODER: training.get("train_vision_encoder", True),
        PROJECTOR: training.get("train_projector", True),
        LANGUAGE_MODEL: training.get("train_language_model", True),
    }
    for name, module in found.items():
        module.requires_grad_(bool(wanted[name]))
    head = getattr(model, "lm_head", None)
    if head is not None:
        head.requires_grad_(bool(wanted[LANGUAGE_MODEL]))
    return {name: sum(p.numel() for p in module.parameters() if p.requires_grad) for name, module in found.items()}


def lora_modules_to_save(training: dict) -> list[str]:
    """With LoRA: the parts trained in full next to the adapters."""
    return [
        name
        for name, key in ((VISION_ENCODER, "train_vision_encoder"), (PROJECTOR, "train_projector"))
        if training.get(key)
    ]


def split_vision_groups(optimizer, model, multiplier: float) -> int:
    """Move the vision encoder's parameters of each optimizer group into a group of their own at lr x multiplier
    (before the scheduler is made: it scales each group's own initial rate). Returns the parameters moved. Done at
    any multiplier, 1 included, so that a checkpoint's optimizer state always has the same groups; a group it made
    (`vision_encoder` set) is not split again."""
    vision = {id(p) for name, p in model.named_parameters() if f"{VISION_ENCODER}." in name and p.requires_grad}
    if not vision:
        return 0
    moved = 0
    for group in list(optimizer.param_groups):
        if group.get("vision_encoder"):
            continue
        mine = [p for p in group["params"] if id(p) in vision]
        if not mine:
            continue
        group["params"] = [p for p in group["params"] if id(p) not in vision]
        optimizer.add_param_group(
            {**{k: v for k, v in group.items() if k != "params"}, "params": mine, "vision_encoder": True}
        )
        optimizer.param_groups[-1]["lr"] = group["lr"] * multiplier
        moved += len(mine)
    optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
    return moved


class ImageBatches:
    """The collator of an image run: TRL's text collator for input_ids / labels (padded, or padding-free), plus
    pixel_values, pixel_attention_mask and spatial_shapes of the batch's images in row order."""

    repeat = 1

    def __init__(self, text_collator, reader):
        self.text_collator = text_collator
        self.reader = reader

    def __call__(self, examples: list[dict]) -> dict:
        sources, tokens = [], []
        for example in examples:
            sources += example.get("image_sources") or []
            tokens += example.get("image_tokens") or []
        batch = self.text_collator([{k: v for k, v in ex.items() if k not in IMAGE_COLUMNS} for ex in examples])
        if not sources:
            return batch
        from leap_finetune.data.images import ImageProblem

        shown = ""
        try:
            for source, expected in zip(sources, tokens, strict=True):
                shown = source[:120]
                width, height = self.reader.size(source)
                now = len(self.reader.layout(width, height).ids)
                if now != expected:
                    raise LeapError(
                        f"the image {shown} now becomes {now} tokens and was prepared as {expected}: it changed "
                        "after the rows were prepared",
                        where="dataset",
                        fix="keep the images unchanged during a run; to train on the new ones start a new run",
                    )
            pixels = self.reader.pixels(sources)
        except ImageProblem as err:  # (checked when the rows were prepared: the file changed since)
            raise LeapError(
                f"an image of this batch cannot be read any more: {err}",
                where="dataset",
                fix="keep the images in place and unchanged during a run (it resumes from its last checkpoint: "
                "`training_config.resume_from_checkpoint: latest`)",
            ) from None
        if self.repeat > 1:  # DPO: the batch holds every row twice (chosen rows, then rejected rows)
            import torch

            pixels = {key: torch.cat([value] * self.repeat) for key, value in pixels.items()}
        batch.update(pixels)
        return batch


class PairImageBatches(ImageBatches):
    """DPO's collator of an image run: TRL's preference collator (chosen rows, then rejected rows, each the prompt
    and its completion) plus the prompt images' pixels, once per half."""

    repeat = 2


def prepare_vision_model(resolved, model, console) -> None:
    """A full fine-tune of a vision-language model: the parts set to false are frozen (LoRA freezes through peft)."""
    if not resolved.vision:
        return
    from leap_finetune.validate.vision import trained_parts

    if resolved.peft is None:
        freeze_parts(model, resolved.training)
    if is_main_process():
        console.print(
            "trains: " + ", ".join(f"{part} {how}" for part, how in trained_parts(resolved.training, resolved.peft))
        )


class VisionRate:
    """A mixin of the SFT and DPO trainers (first among their bases): the optimizer gives the vision encoder
    learning_rate x vision_encoder_lr_multiplier (recipes/vision.py split_vision_groups) when the class attribute is
    set (an image run)."""

    vision_lr_multiplier: float | None = None

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        if self.vision_lr_multiplier is not None:
            split_vision_groups(self.optimizer, model if model is not None else self.model, self.vision_lr_multiplier)
        return optimizer


def image_collator(resolved, tokenizer, args, *, padding_free: bool = False):
    """The collator of an image run (recipes/vision.py), None for a text run (the trainer's own): TRL's text
    collator of the type (SFT's or DPO's) plus the batch's pixels."""
    if not resolved.vision:
        return None
    from leap_finetune.models.vision import image_reader

    reader = image_reader(resolved, tokenizer)
    from leap_finetune.data.row_kinds import row_kind_of

    if row_kind_of(resolved).pairs:
        from trl.trainer.dpo_trainer import DataCollatorForPreference

        # (rows with images fit max_length: checked when the rows were prepared, so nothing is cut here)
        text = DataCollatorForPreference(
            pad_token_id=tokenizer.pad_token_id,
            # (text pairs are cut as TRL's own collator cuts them; pairs with images fit, checked with the rows)
            max_length=getattr(args, "max_length", None),
            truncation_mode=getattr(args, "truncation_mode", "keep_start"),
            pad_to_multiple_of=getattr(args, "pad_to_multiple_of", None),
        )
        return PairImageBatches(text, reader)
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    text = DataCollatorForLanguageModeling(
        pad_token_id=tokenizer.pad_token_id,
        padding_free=padding_free,
        pad_to_multiple_of=getattr(args, "pad_to_multiple_of", None),
    )
    return ImageBatches(text, reader)
