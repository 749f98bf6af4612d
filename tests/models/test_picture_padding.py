"""The vision encoder runs over the pictures' real patches only (models/vision.py real_patches_only): each batch cut
to its largest picture, the pictures packed into one sequence with attention kept inside each picture. The model's
output and gradients are what transformers' own encoder gives over the processor's padding."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("torchvision")

from PIL import Image  # noqa: E402

from leap_finetune.models.loading import _load_model, load_model  # noqa: E402
from leap_finetune.models.tiny import build_tiny_processor, load_tiny_tokenizer  # noqa: E402
from leap_finetune.models.vision import PATCH_STEP, real_patches_only  # noqa: E402

NAME = "tiny-lfm2.5-vl"
SMALL, TALL, LARGE = (32, 32), (40, 70), (300, 200)  # 16, 24 and 48 of the tiny processor's 64 patches


@pytest.fixture(scope="module")
def models():
    """(ours, transformers' own: the same seeded weights, nothing changed), the processor."""
    tokenizer = load_tiny_tokenizer(NAME)
    ours, theirs = load_model(NAME, tokenizer).eval(), _load_model(NAME, tokenizer).eval()
    return ours, theirs, build_tiny_processor(tokenizer)


def _inputs(processor, sizes):
    colours = ("red", "blue", "green", "white")
    images = [[Image.new("RGB", size, colour)] for size, colour in zip(sizes, colours, strict=False)]
    text = ["<image>what colour is it?"] * len(images)
    return processor(text=text, images=images, return_tensors="pt", padding=True)


def _run(model, inputs) -> tuple[torch.Tensor, int, int]:
    """The logits; the patches per picture the encoder was handed; the patches its first MLP ran over."""
    handed, ran = [], []
    tower = model.model.vision_tower
    hooks = [
        tower.register_forward_pre_hook(lambda m, a, k: handed.append(k["pixel_values"].shape[1]), with_kwargs=True),
        tower.encoder.layers[0].mlp.register_forward_hook(lambda m, a, o: ran.append(a[0].shape[:-1].numel())),
    ]
    try:
        with torch.no_grad():
            logits = model(**inputs).logits
    finally:
        for hook in hooks:
            hook.remove()
    return logits, handed[-1], ran[0]


def test_small_pictures_are_cut_and_packed_and_the_output_is_unchanged(models):
    ours, theirs, processor = models
    inputs = _inputs(processor, [SMALL, TALL])
    real = int(inputs["pixel_attention_mask"].sum())
    reference, handed, ran = _run(theirs, inputs)
    assert handed == 64 and ran == 2 * 64  # transformers' encoder: every picture padded to the processor's most
    logits, handed, ran = _run(ours, inputs)
    assert handed == -(-24 // PATCH_STEP) * PATCH_STEP  # cut to the largest picture
    assert ran == real == 16 + 24  # packed: real patches only
    torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)


def test_a_batch_with_a_large_picture_is_packed_all_the_same(models):
    ours, theirs, processor = models
    inputs = _inputs(processor, [SMALL, LARGE, TALL])
    reference, _, _ = _run(theirs, inputs)
    logits, _, ran = _run(ours, inputs)
    assert ran == int(inputs["pixel_attention_mask"].sum()) == 16 + 48 + 24
    torch.testing.assert_close(logits, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_encoders_gradients_are_transformers_own(models, checkpointing):
    ours, theirs, processor = models
    inputs = _inputs(processor, [SMALL, LARGE])
    grads = []
    for model in (copy.deepcopy(ours).train(), copy.deepcopy(theirs).train()):
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(**inputs, labels=inputs["input_ids"]).loss.backward()
        tower = model.model.vision_tower
        grads.append(
            [tower.embeddings.patch_embedding.weight.grad, tower.encoder.layers[0].self_attn.q_proj.weight.grad]
        )
    for mine, reference in zip(*grads, strict=True):
        assert float(reference.abs().sum()) > 0
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-6)


def test_the_change_is_made_once_and_survives_a_copy(models):
    ours, _, _ = models
    assert real_patches_only(ours) is False  # (already done by load_model)
    assert len(ours.model.vision_tower._forward_pre_hooks) == 1
    copied = copy.deepcopy(ours)
    assert type(copied.model.vision_tower) is type(ours.model.vision_tower)
    assert type(ours.model.vision_tower).__name__.startswith("Packed")
