"""The vision encoder runs over the pictures' real patches only (models/vision.py trim_picture_padding): the model's
output is what it was with the processor's padding, and the encoder is handed fewer patches."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("torchvision")

from PIL import Image  # noqa: E402

from leap_finetune.models.loading import load_model  # noqa: E402
from leap_finetune.models.tiny import build_tiny_processor, load_tiny_tokenizer  # noqa: E402
from leap_finetune.models.vision import PATCH_STEP, trim_picture_padding  # noqa: E402

NAME = "tiny-lfm2.5-vl"


@pytest.fixture(scope="module")
def parts():
    tokenizer = load_tiny_tokenizer(NAME)
    model = load_model(NAME, tokenizer).eval()
    return model, build_tiny_processor(tokenizer)


def _inputs(processor, sizes):
    images = [[Image.new("RGB", size, color)] for size, color in zip(sizes, ("red", "blue", "green"), strict=False)]
    text = ["<image>what colour is it?"] * len(images)
    return processor(text=text, images=images, return_tensors="pt", padding=True)


def _encoder_patches(model, inputs) -> tuple[torch.Tensor, int]:
    """The logits, and how many patches per picture the vision encoder was handed."""
    seen = []
    hook = model.model.vision_tower.register_forward_hook(
        lambda module, args, output: seen.append(output.last_hidden_state.shape[1])
    )
    try:
        with torch.no_grad():
            logits = model(**inputs).logits
    finally:
        hook.remove()
    return logits, seen[0]


def test_small_pictures_are_cut_to_their_patches_and_the_output_is_unchanged(parts):
    model, processor = parts
    inputs = _inputs(processor, [(32, 32), (40, 70)])  # 16 and 24 of the processor's 64 patches
    padded = inputs["pixel_values"].shape[1]
    longest = int(inputs["pixel_attention_mask"].sum(-1).max())
    assert longest < padded == 64

    untrimmed = copy.deepcopy(model)
    untrimmed.model.vision_tower._forward_pre_hooks.clear()  # (the model as transformers builds it)
    reference, reference_patches = _encoder_patches(untrimmed, inputs)
    logits, patches = _encoder_patches(model, inputs)

    assert reference_patches == padded
    assert patches == -(-longest // PATCH_STEP) * PATCH_STEP < padded
    torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)


def test_a_batch_with_a_full_picture_is_left_as_it_is(parts):
    model, processor = parts
    inputs = _inputs(processor, [(32, 32), (300, 200), (40, 70)])  # the second fills most of the 64 patches
    longest = int(inputs["pixel_attention_mask"].sum(-1).max())
    _, patches = _encoder_patches(model, inputs)
    assert patches == min(64, -(-longest // PATCH_STEP) * PATCH_STEP)


def test_gradients_reach_the_encoder_through_the_cut(parts):
    model, processor = parts
    trained = copy.deepcopy(model).train()
    inputs = _inputs(processor, [(32, 32)])
    loss = trained(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    first = trained.model.vision_tower.embeddings.patch_embedding.weight.grad
    assert first is not None and float(first.abs().sum()) > 0


def test_the_hook_is_added_once(parts):
    model, _ = parts
    assert model.model.vision_tower._leap_trim_hook
    assert trim_picture_padding(model) is False
    assert len(model.model.vision_tower._forward_pre_hooks) == 1
