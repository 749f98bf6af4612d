"""LFM2-VL's vision tower in the published layout (models/lfm2_keys.py): what vLLM's LFM2-VL and llama.cpp's converter
read (`model.vision_tower.vision_model.*`), where transformers 5 keeps the module flat. Measured 2026-12-07: vLLM 0.26
refused a folder saved flat and TRL's weight sync of flat names (bench/RESULTS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from leap_finetune.models.lfm2_keys import published_vision_name
from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer


def _keys(folder: Path) -> list[str]:
    keys = []
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as handle:
            keys += list(handle.keys())
    return keys


@pytest.fixture(scope="module")
def tiny_vl():
    return build_tiny_model("tiny-lfm2.5-vl", load_tiny_tokenizer("tiny-lfm2.5-vl"))


@pytest.mark.parametrize(
    ("name", "published"),
    [
        (
            "model.vision_tower.embeddings.patch_embedding.weight",
            "model.vision_tower.vision_model.embeddings.patch_embedding.weight",
        ),  # fmt: skip
        ("vision_tower.encoder.layers.0.mlp.fc1.bias", "vision_tower.vision_model.encoder.layers.0.mlp.fc1.bias"),
        (
            "model.vision_tower.vision_model.post_layernorm.weight",
            "model.vision_tower.vision_model.post_layernorm.weight",
        ),
        ("model.language_model.layers.0.conv.in_proj.weight", "model.language_model.layers.0.conv.in_proj.weight"),
        ("model.multi_modal_projector.linear_1.weight", "model.multi_modal_projector.linear_1.weight"),
    ],
)
def test_only_flat_vision_tower_names_move(name, published):
    assert published_vision_name(name) == published


def test_a_model_built_from_a_config_saves_the_published_layout_and_loads_back_equal(tiny_vl, tmp_path):
    tiny_vl.save_pretrained(tmp_path)
    vision = [k for k in _keys(tmp_path) if ".vision_tower." in k]
    assert vision and all(k.startswith("model.vision_tower.vision_model.") for k in vision), vision[:3]
    # a process that never imported leap-finetune (a user's transformers, an export) reads the same weights
    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForImageTextToText\n"
        "m = AutoModelForImageTextToText.from_pretrained(sys.argv[1])\n"
        "print(repr(float(m.model.vision_tower.embeddings.patch_embedding.weight.double().sum())))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    expected = float(tiny_vl.model.vision_tower.embeddings.patch_embedding.weight.detach().double().sum())
    assert float(done.stdout.strip().splitlines()[-1]) == expected


def test_a_published_folder_loaded_and_saved_again_stays_published_with_the_same_weights(tiny_vl, tmp_path):
    """A checkpoint resumed, a `model/` exported or merged: loaded by leap-finetune, saved again, still the layout
    vLLM reads (transformers reverses on save the renaming it applied on load)."""
    from leap_finetune.models.loading import load_model

    first = tmp_path / "first"
    tiny_vl.save_pretrained(first)
    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    tokenizer.save_pretrained(first)
    model = load_model(str(first), tokenizer)
    again = tmp_path / "again"
    model.save_pretrained(again)
    vision = [k for k in _keys(again) if ".vision_tower." in k]
    assert vision and all(k.startswith("model.vision_tower.vision_model.") for k in vision)
    saved = model.state_dict()
    for key, value in tiny_vl.state_dict().items():
        assert (saved[key].float() == value.detach().float()).all(), key


def test_the_weight_sync_to_vllm_sends_the_published_names():
    """TRL's VLLMGeneration passes every synced name through _fix_param_name_to_vllm (TRL 1.16): after
    vllm_names_in_published_layout, a flat vision-tower name arrives published, the rest as TRL makes them."""
    from trl.generation.vllm_generation import VLLMGeneration

    from leap_finetune.recipes.grpo_images import vllm_names_in_published_layout

    generation = VLLMGeneration.__new__(VLLMGeneration)  # (no engine: vLLM cannot run here; only the names)

    class Trainer:
        vllm_generation = generation

    vllm_names_in_published_layout(Trainer)
    fix = generation._fix_param_name_to_vllm
    assert fix("model.vision_tower._checkpoint_wrapped_module.encoder.layers.0.mlp.fc1.weight") == (
        "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"
    )
    assert fix("model.language_model.layers.1.self_attn.q_proj.weight") == (
        "model.language_model.layers.1.self_attn.q_proj.weight"
    )
    assert fix("model.vision_tower.modules_to_save.default.post_layernorm.weight", ["modules_to_save.default."]) == (
        "model.vision_tower.vision_model.post_layernorm.weight"
    )
