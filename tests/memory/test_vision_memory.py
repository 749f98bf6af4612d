"""The vision encoder's part of the memory estimate (memory/pictures.py, memory/estimate.py): GRPO on pictures
predicted at or over the peaks measured on an H100 (memory/calibration.py MEASURED_PICTURES), from the rows'
pictures and their prompts' real length; a frozen encoder keeps nothing for the backward; text runs are untouched.

The LFM2-VL models are folders with the published architecture's config.json, the tiny VL tokenizer and the
processor settings bench/vl_grpo.py ran with - no weights: `plan` reads the config alone."""

from __future__ import annotations

import dataclasses
import json

import pytest

from leap_finetune.launch.checks import prepare
from leap_finetune.memory import estimate
from leap_finetune.memory.calibration import MEASURED, MEASURED_PICTURES, TOLERANCE, VisionFit
from leap_finetune.memory.estimate import GIB, activation_bytes
from leap_finetune.memory.pictures import row_tiles
from leap_finetune.memory.plan import longest_row, predict, setup_of, shape_of, training_process_memory
from leap_finetune.validate.loader import load_config
from tests.conftest import invoke, write_config, write_jsonl
from tests.memory.test_calibration import measured_resolved

# bench/vl_sft_throughput.py MODELS: LiquidAI's processor settings of each size
PROCESSOR = {"do_image_splitting": True, "min_tiles": 2, "max_tiles": 10, "min_image_tokens": 64,
             "max_image_tokens": 256, "tile_size": 512, "encoder_patch_size": 16, "downsample_factor": 2}  # fmt: skip
SIZES = {"LFM2-VL-450M": (False, 2.0), "LFM2-VL-1.6B": (True, 1.5)}  # (use_thumbnail, max_pixels_tolerance)
H100 = 80 * 10**9


def vl_folder(folder, name: str):
    """A weightless LFM2-VL of `name`'s published architecture, with the tiny VL tokenizer and a real processor."""
    from transformers import AutoConfig, Lfm2VlImageProcessor, Lfm2VlProcessor

    from leap_finetune.memory.shapes import published
    from leap_finetune.models.tiny import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    known = dict(published(name))
    config = AutoConfig.for_model(known.pop("model_type"), **known)
    config.image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    config.save_pretrained(folder)
    thumbnail, tolerance = SIZES[name]
    image_processor = Lfm2VlImageProcessor(**PROCESSOR, use_thumbnail=thumbnail, max_pixels_tolerance=tolerance)
    processor = Lfm2VlProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template
    )
    processor.save_pretrained(folder)
    return folder


def grpo_on_pictures(workdir, name: str, size=(512, 512), prompts: int = 8, **training) -> dict:
    """bench/vl_grpo.py's run: 8 prompts x 8 generations, 256 new tokens, a picture per prompt."""
    from PIL import Image

    model = vl_folder(workdir / name, name)
    Image.new("RGB", size, (200, 40, 90)).save(workdir / "picture.png")
    part = [{"type": "image", "image": "picture.png"}, {"type": "text", "text": "Describe the shapes in the picture."}]
    write_jsonl(workdir / "prompts.jsonl", [{"prompt": [{"role": "user", "content": part}]}] * prompts)
    settings = {"per_device_train_batch_size": 64, "num_generations": 8, "max_completion_length": 256}
    return {
        "project_name": "p",
        "model_name": str(model),
        "training_type": "grpo",
        "dataset": {"path": str(workdir / "prompts.jsonl")},
        "rewards": [{"name": "length", "target_tokens": 256}],
        "training_config": {"use_vllm": False, "max_steps": 6, **settings, **training},
    }


def predicted(config: dict, workdir):
    """(the prediction as `plan` makes it from the prepared rows, the longest row, the rows' pictures)."""
    from leap_finetune.models.loading import tokenizer_at_hand

    resolved = load_config(write_config(workdir, config))
    tokenizer, _ = tokenizer_at_hand(resolved.model_id)
    _, _, prepared = prepare(resolved, tokenizer=tokenizer)
    longest, tiles = longest_row(prepared), row_tiles(resolved, prepared)
    return predict(resolved, shape_of(resolved), longest, H100, tiles), longest, tiles


@pytest.mark.parametrize("row", MEASURED_PICTURES, ids=lambda r: r["model"])
def test_grpo_on_pictures_is_predicted_at_or_over_the_measured_peak(row, workdir):
    config = grpo_on_pictures(workdir, row["model"], row["picture"], **row.get("settings", {}))
    memory, longest, tiles = predicted(config, workdir)
    # the prompt as the model reads it: its 256 image tokens expanded (not max_prompt_length's 512 assumed)
    assert 256 < longest < 300
    assert (tiles.most, tiles.patches, tiles.counted) == (1, 1024, True)  # a 512x512 picture: one of 32x32 patches
    peak = memory.peak / GIB
    assert row["measured_gib"] <= peak <= row["measured_gib"] * (1 + TOLERANCE), (peak, memory.parts())


def test_the_plan_that_nearly_ran_out_of_memory_now_turns_checkpointing_on(workdir):
    """LFM2-VL-450M at 64 completions fitted an 80 GB card without checkpointing (predicted 48.7 GiB, measured
    70.27): with the vision encoder counted it is over the budget, and checkpointing brings it under."""
    config = grpo_on_pictures(workdir, "LFM2-VL-450M")
    result = invoke("plan", str(write_config(workdir, config)), "--json", "--gpu-memory", "80GB", cwd=workdir)
    assert result.returncode == 0, result.stderr
    budget = json.loads(result.stdout)["memory_budget"]
    assert [c["key"] for c in budget["changes"]] == ["activation_checkpointing"], budget
    assert budget["fits"]


def test_a_frozen_vision_encoder_keeps_nothing_for_the_backward(workdir):
    trained, _, tiles = predicted(grpo_on_pictures(workdir, "LFM2-VL-450M"), workdir)
    frozen, _, _ = predicted(grpo_on_pictures(workdir, "LFM2-VL-450M", train_vision_encoder=False), workdir)
    assert frozen.activations < trained.activations and frozen.peak < trained.peak
    # what is left is the language model's (the encoder's no-grad forward is over before the language model's starts)
    resolved = load_config(write_config(workdir, grpo_on_pictures(workdir, "LFM2-VL-450M", train_vision_encoder=False)))
    shape = shape_of(resolved)
    setup = setup_of(resolved, shape, 287, tiles)
    assert setup.vision_patches == 64 * 1024 and not setup.vision_trained
    assert activation_bytes(shape, setup) == activation_bytes(shape, dataclasses.replace(setup, vision_patches=0))


def test_lora_on_the_language_model_leaves_the_encoder_frozen_and_lora_on_its_layers_does_not(workdir):
    config = grpo_on_pictures(workdir, "LFM2-VL-450M")
    lora = load_config(write_config(workdir, {**config, "peft_config": {"extends": "DEFAULT_VLM_LORA"}}))
    assert not setup_of(lora, shape_of(lora), 287).vision_trained
    everything = {"extends": "DEFAULT_VLM_LORA", "target_modules": r".*\.(q_proj|k_proj|v_proj|out_proj)"}
    on_vision = load_config(write_config(workdir, {**config, "peft_config": everything}))
    assert setup_of(on_vision, shape_of(on_vision), 287).vision_trained


def test_a_large_picture_counts_its_tiles_as_the_data_step_cuts_it(workdir):
    from leap_finetune.models.loading import tokenizer_at_hand
    from leap_finetune.models.vision import image_reader

    config = grpo_on_pictures(workdir, "LFM2-VL-1.6B", size=(1600, 1000))
    resolved = load_config(write_config(workdir, config))
    tokenizer, _ = tokenizer_at_hand(resolved.model_id)
    _, _, prepared = prepare(resolved, tokenizer=tokenizer)
    tiles = row_tiles(resolved, prepared)
    layout = image_reader(resolved, tokenizer).layout(1600, 1000)
    assert tiles.most == layout.tiles > 1  # (tiles and the thumbnail: data/images.py's layout)
    small, _, _ = predicted(grpo_on_pictures(workdir, "LFM2-VL-1.6B"), workdir)
    large = predict(resolved, shape_of(resolved), longest_row(prepared), H100, tiles)
    assert large.activations > small.activations


def test_small_pictures_count_their_own_patches_not_the_processors_padding(workdir):
    """The encoder gets a batch cut to its largest picture (models/vision.py trim_picture_padding): 256x256 pictures
    are 256 patches of the 1,024 the processor pads to, and the prediction shrinks with them."""
    from leap_finetune.models.loading import tokenizer_at_hand

    small_config = grpo_on_pictures(workdir, "LFM2-VL-450M", size=(256, 256))
    resolved = load_config(write_config(workdir, small_config))
    tokenizer, _ = tokenizer_at_hand(resolved.model_id)
    _, _, prepared = prepare(resolved, tokenizer=tokenizer)
    tiles = row_tiles(resolved, prepared)
    assert (tiles.most, tiles.patches, tiles.counted) == (1, 256, True)
    small = predict(resolved, shape_of(resolved), longest_row(prepared), H100, tiles)
    full, _, _ = predicted(grpo_on_pictures(workdir, "LFM2-VL-450M"), workdir)  # (512x512: 1,024 patches)
    assert small.activations < full.activations


def test_without_the_rows_one_picture_per_row_of_the_most_patches_is_assumed(workdir):
    resolved = load_config(write_config(workdir, grpo_on_pictures(workdir, "LFM2-VL-450M")))
    tiles = row_tiles(resolved)
    assert (tiles.most, tiles.patches, tiles.counted) == (1, 1024, False)
    assert training_process_memory(resolved).activations > 0


def test_text_predictions_do_not_depend_on_the_vision_constants(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = MEASURED[:3] + [r for r in MEASURED if r["method"] == "dpo"][:1]
    resolved = [measured_resolved(row, tmp_path) for row in rows]
    before = [training_process_memory(r) for r in resolved]
    for r in resolved:
        assert row_tiles(r) is None and setup_of(r, shape_of(r)).vision_patches == 0
    monkeypatch.setattr(estimate, "VISION_FIT", VisionFit(layer_bytes=1e6, checkpoint_layer_bytes=1e6))
    assert [training_process_memory(r) for r in resolved] == before


def test_a_text_grpo_run_reads_its_longest_prompt(workdir):
    write_jsonl(workdir / "prompts.jsonl", [{"prompt": "Name a color " * n, "solution": "teal"} for n in (1, 9, 3)])
    config = {
        "project_name": "g",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": ["accuracy"],
        "training_config": {"use_vllm": False},
    }
    resolved = load_config(write_config(workdir, config))
    from leap_finetune.models.loading import tokenizer_at_hand

    _, _, prepared = prepare(resolved, tokenizer=tokenizer_at_hand(resolved.model_id)[0])
    assert longest_row(prepared) == int(prepared.train.tokens_per_row.max()) > 9


@pytest.mark.parametrize("training_type", ["dpo", "kto"])
def test_a_preference_run_reads_its_longest_prompt_and_answer(workdir, training_type):
    """The preference tables keep prompt_ids and chosen_ids/rejected_ids (KTO: completion_ids); the plan looked for
    other column names and so always assumed max_length for every row - a short-row DPO run was planned as long."""
    if training_type == "dpo":
        rows = [{"prompt": "Say hi " * n, "chosen": "hi " * n, "rejected": "no"} for n in (1, 7, 3)]
    else:
        rows = [{"prompt": "Say hi " * n, "completion": "hi " * n, "label": n % 2 == 1} for n in (1, 7, 3, 2)]
    write_jsonl(workdir / "pairs.jsonl", rows)
    config = {
        "project_name": "p",
        "model_name": "tiny-lfm2",
        "training_type": training_type,
        "dataset": {"path": "pairs.jsonl"},
        "training_config": {"max_length": 1024},
    }
    resolved = load_config(write_config(workdir, config))
    from leap_finetune.models.loading import tokenizer_at_hand

    _, _, prepared = prepare(resolved, tokenizer=tokenizer_at_hand(resolved.model_id)[0])
    table = prepared.train.table.to_pydict()
    answers = table["chosen_ids"] + table["rejected_ids"] if training_type == "dpo" else table["completion_ids"]
    expected = max(map(len, table["prompt_ids"])) + max(map(len, answers))
    assert longest_row(prepared) == expected and 20 < expected < 1024


def test_the_lora_a_full_fine_tune_does_not_fit_is_pointed_to_is_lora_as_it_would_run(workdir):
    """Was: the "does not fit" error's LoRA alternative of a full VL fine-tune kept the full run's trained vision
    encoder and counted its activations (13.8 GiB named where the LoRA run needs 7.1)."""
    from leap_finetune.memory.budget import alternatives, fit_to_budget

    config = grpo_on_pictures(workdir, "LFM2-VL-450M")
    full = load_config(write_config(workdir, config))
    lora = load_config(write_config(workdir, {**config, "peft_config": {"extends": "DEFAULT_VLM_LORA"}}))
    budget = 16 * 2**30
    named = dict(alternatives(full, budget, None, row_tiles(full)))
    as_run = fit_to_budget(lora, budget, None, row_tiles(lora))
    assert named["LoRA (peft_config: {extends: DEFAULT_LORA})"].peak == as_run.memory.peak
