"""Fine-tuning the tiny LFM2-VL on pictures through the real trainers (issue #27): it learns a task only the image
answers (every row asks the same question) from chance to >= 0.9 on held-out pictures, full and LoRA; the trained
folder loads with transformers' own classes and answers from the picture; frozen parts stay as they were and the
vision encoder gets its own learning rate; DPO on pairs that differ only in the picture raises the held-out reward
accuracy."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from leap_finetune.api import run_config
from tests.conftest import EXAMPLES, invoke, write_config, write_jsonl

BENCH = "benchmark/shape_colour/score"


def held_out_pictures() -> list[tuple[str, str]]:
    """(path, colour) of two held-out pictures of different colours."""
    rows = [json.loads(line) for line in (EXAMPLES / "data" / "shapes_bench.jsonl").read_text().splitlines()]
    picked = {}
    for row in rows:
        colour = row["messages"][1]["content"]
        picked.setdefault(colour, str(EXAMPLES / "data" / row["messages"][0]["content"][0]["image"]))
    return [(path, colour) for colour, path in list(picked.items())[:2]]


def answer(model, processor, path: str) -> str:
    messages = [
        {
            "role": "user",
            "content": [{"type": "image", "image": path}, {"type": "text", "text": "What colour is the shape?"}],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[[Image.open(path).convert("RGB")]], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    return processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True).strip()


@pytest.mark.slow
def test_image_sft_learns_what_only_the_picture_says_and_loads_with_transformers(examples):
    summary = run_config(examples / "vl_sft_images.yaml")
    assert summary["initial_benchmarks"][BENCH] <= 0.5  # chance is 0.25 (four colours)
    assert summary["benchmarks"][BENCH] >= 0.9
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = summary["model_dir"]
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    for path, colour in held_out_pictures():  # the same question, two pictures: two right answers
        assert answer(model, processor, path) == colour


@pytest.mark.slow
def test_lora_on_the_language_model_learns_to_read_the_picture(workdir):
    """A text-trained base (the same rows without their pictures: it knows the four answers, not which) then LoRA on
    the language model alone (the profile's default: vision encoder and projector frozen) learns from the images."""
    rows = [json.loads(line) for line in (EXAMPLES / "data" / "shapes_sft.jsonl").read_text().splitlines()]
    for row in rows:
        row["messages"][0]["content"] = [p for p in row["messages"][0]["content"] if p["type"] == "text"]
    write_jsonl(workdir / "text_only.jsonl", rows)
    base = run_config(
        write_config(
            workdir,
            {
                "project_name": "vl_base",
                "model_name": "tiny-lfm2.5-vl",
                "dataset": "text_only.jsonl",
                "training_config": {
                    "num_train_epochs": 4,
                    "per_device_train_batch_size": 16,
                    "learning_rate": 3e-3,
                    "max_length": 64,
                    "save_steps": 1000,
                },
            },
            "base.yaml",
        )
    )
    config = (EXAMPLES / "vl_sft_images.yaml").read_text()
    config = config.replace("model_name: tiny-lfm2.5-vl", f"model_name: {base['model_dir']}")
    config = config.replace("path: data/", f"path: {EXAMPLES / 'data'}/")
    config = config.replace("vision_encoder_lr_multiplier: 1.0", "vision_encoder_lr_multiplier: 0.1")
    config = config.replace("learning_rate: 3e-3", "learning_rate: 3e-3\n  save_steps: 1000")
    config = config.replace("  save_steps: 72\n", "")
    config += "\npeft_config:\n  extends: DEFAULT_VLM_LORA\n  r: 64\n  lora_alpha: 128\n  lora_dropout: 0.0\n"
    (workdir / "lora.yaml").write_text(config)
    summary = run_config(workdir / "lora.yaml")
    assert summary["initial_benchmarks"][BENCH] <= 0.5
    assert summary["benchmarks"][BENCH] >= 0.9
    from safetensors import safe_open

    run_dir = summary["run_dir"]
    with safe_open(f"{run_dir}/adapter/adapter_model.safetensors", "pt") as adapter:
        names = list(adapter.keys())
    assert names and all("language_model" in name and "lora_" in name for name in names)  # nothing else trained


class GroupRates:
    """The optimizer's groups, seen at the first step: (learning rate, parameter names)."""

    def __init__(self):
        self.groups = None

    def callback(self):
        from transformers import TrainerCallback

        outer = self

        class Record(TrainerCallback):
            def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
                if outer.groups is None:
                    names = {id(p): n for n, p in model.named_parameters()}
                    outer.groups = [
                        (group["lr"], [names.get(id(p), "?") for p in group["params"]])
                        for group in optimizer.param_groups
                    ]

        return Record()


def test_frozen_parts_stay_and_the_vision_encoder_gets_its_own_learning_rate(workdir):
    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    config = (EXAMPLES / "vl_sft_images.yaml").read_text().replace("path: data/", f"path: {EXAMPLES / 'data'}/")
    config = config.replace("vision_encoder_lr_multiplier: 1.0", "vision_encoder_lr_multiplier: 0.1")
    config = config.replace("# train_language_model: true", "train_language_model: false")
    config = config.replace("num_train_epochs: 12", "max_steps: 3\n  lr_scheduler_type: constant")
    config = config.replace("warmup_steps: 0.05", "warmup_steps: 0")
    config = config.split("evals:")[0] + "training_config:" + config.split("training_config:")[1]  # no benchmarks
    (workdir / "frozen.yaml").write_text(config)
    rates = GroupRates()
    summary = run_config(workdir / "frozen.yaml", callbacks=[rates.callback()])
    from transformers import AutoModelForImageTextToText

    trained = AutoModelForImageTextToText.from_pretrained(summary["model_dir"]).state_dict()
    tokenizer = load_tiny_tokenizer("tiny-lfm2.5-vl")
    base = build_tiny_model("tiny-lfm2.5-vl", tokenizer).state_dict()

    def changed(part: str) -> bool:
        keys = [k for k in base if f".{part}." in k]
        assert keys, part
        return any(not torch.equal(base[k], trained[k]) for k in keys)

    assert not changed("language_model")  # train_language_model: false
    assert changed("multi_modal_projector") and changed("vision_tower")
    # the vision encoder's parameters have groups of their own at 0.1 x the others' rate
    vision = [lr for lr, names in rates.groups if names and all("vision_tower" in n for n in names)]
    other = [lr for lr, names in rates.groups if names and not any("vision_tower" in n for n in names)]
    assert vision and other and all(v == pytest.approx(0.1 * other[0]) for v in vision)
    assert all(o == pytest.approx(3e-3) for o in other)


@pytest.mark.slow
def test_dpo_on_pictures_raises_the_held_out_reward_accuracy(examples):
    summary = run_config(examples / "vl_dpo_images.yaml")
    history = [json.loads(line) for line in open(f"{summary['run_dir']}/metrics.jsonl") if "eval_loss" in line]
    accuracies = [m["eval_rewards/accuracies"] for m in history if "eval_rewards/accuracies" in m]
    assert accuracies[0] <= 0.5 and accuracies[-1] >= 0.9, accuracies


def test_inspect_shows_each_picture_with_its_tokens(examples):
    result = invoke("inspect", str(examples / "vl_sft_images.yaml"), "-n", "1")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "<image>What colour is the shape?" in out
    assert "<image> 1: " in out and "shape_images/train/000.png" in out and "tokens (no loss)" in out
    as_json = json.loads(invoke("inspect", str(examples / "vl_sft_images.yaml"), "-n", "1", "--json").stdout)
    assert as_json[0]["images"][0]["tokens"] > 0 and as_json[0]["tokens"] > as_json[0]["trained_tokens"]


@pytest.mark.slow
def test_a_resumed_full_fine_tune_continues_the_vision_encoder_it_saved(workdir):
    """Checkpoints keep the vision tower in the published layout (models/lfm2_keys.py), and the Trainer resumes
    with load_state_dict on the saved file: the encoder's weights must come back, not stay as built (they did,
    silently, before the model took the published names). 2 steps + 2 resumed = 4 uninterrupted, encoder included."""
    from safetensors.torch import load_file

    config = (EXAMPLES / "vl_sft_images.yaml").read_text().replace("path: data/", f"path: {EXAMPLES / 'data'}/")
    config = config.replace("num_train_epochs: 12", "max_steps: 4\n  lr_scheduler_type: constant")
    config = config.replace("warmup_steps: 0.05", "warmup_steps: 0").replace("save_steps: 72", "save_steps: 2")
    config = config.split("evals:")[0] + "training_config:" + config.split("training_config:")[1]  # no benchmarks
    straight = workdir / "straight.yaml"
    straight.write_text(config.replace("project_name: ", "project_name: straight-"))
    halted = workdir / "halted.yaml"
    halted.write_text(config.replace("project_name: ", "project_name: halted-").replace("max_steps: 4", "max_steps: 2"))
    expected = load_file(f"{run_config(straight)['model_dir']}/model.safetensors")
    first = run_config(halted)
    resumed = halted.read_text().replace("max_steps: 2", "max_steps: 4\n  resume_from_checkpoint: latest")
    halted.write_text(resumed)
    again = run_config(halted)
    assert again["run_dir"] == first["run_dir"]
    got = load_file(f"{again['model_dir']}/model.safetensors")
    vision = [k for k in expected if k.startswith("model.vision_tower.vision_model.")]
    assert vision and set(got) == set(expected)
    for key in vision:
        assert torch.allclose(got[key].float(), expected[key].float(), atol=1e-6), key
