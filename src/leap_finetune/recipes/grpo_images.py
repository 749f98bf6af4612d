"""GRPO on pictures (LFM2-VL, LFM2.5-VL): the prompts' images reach the rollouts, the log-probs and the reference.

TRL's GRPOTrainer takes a vision-language model through its conversational path: with a processor as its
processing class it renders each prompt's messages with the chat template and the images, so generation, the
policy's and the reference's log-probs all see the pixels. The prepared rows (data/grpo_rows.py) keep, for an
image run, the prompt's messages (`prompt_messages`, with `<image>` where each image goes) and the images'
sources (`images`); here they become what TRL reads - messages with image parts and the decoded pictures - as
the trainer reads each row (a dataset transform: the pictures are not copied into the prepared dataset).
"""

from __future__ import annotations

import json

IMAGE = "<image>"


def message_parts(message: dict) -> dict:
    """A message whose text holds `<image>` placeholders as TRL's structured content: text and image parts in
    order (the images are filled in by TRL, in the order of the row's `images`)."""
    content = message.get("content")
    if not isinstance(content, str) or IMAGE not in content:
        return message
    parts = []
    for index, text in enumerate(content.split(IMAGE)):
        if index:
            parts.append({"type": "image"})
        if text:
            parts.append({"type": "text", "text": text})
    return {**message, "content": parts}


def with_images(dataset):
    """The prepared GRPO rows as TRL's vision-language rows: `prompt` the conversation (image parts), `images` the
    pictures decoded as every image of the run is (RGB; data/images.py)."""
    if dataset is None:
        return None
    from leap_finetune.data.images import open_image

    def to_trl(batch: dict) -> dict:
        out = dict(batch)
        out["prompt"] = [[message_parts(m) for m in json.loads(text)] for text in batch["prompt_messages"]]
        out["images"] = [[open_image(source) for source in sources] for sources in batch["images"]]
        return out

    dataset.set_transform(to_trl)
    return dataset


def processor_for(resolved, tokenizer):
    """The processing class TRL renders image prompts with: the model's processor (the run's image_processor
    settings applied) sharing leap-finetune's tokenizer and chat template."""
    from leap_finetune.models.vision import load_processor

    settings = resolved.image_processor.settings() if resolved.image_processor is not None else None
    processor = load_processor(resolved.model_id, tokenizer, settings)
    processor.chat_template = tokenizer.chat_template
    return processor


def vllm_names_in_published_layout(trainer) -> None:
    """TRL sends the policy's weights to vLLM under the names of `named_parameters()`, and transformers 5 names
    LFM2-VL's vision tower flat, where vLLM's LFM2-VL loads the published layout (models/lfm2_keys.py): each name
    passes through `published_vision_name` on its way (colocate and server alike)."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is None:
        return
    from leap_finetune.models.lfm2_keys import published_vision_name

    fix = generation._fix_param_name_to_vllm  # (TRL 1.16: every synced name goes through it)

    def published(name: str, extra_prefixes: list[str] | None = None) -> str:
        return published_vision_name(fix(name, extra_prefixes))

    generation._fix_param_name_to_vllm = published
