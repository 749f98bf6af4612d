"""GRPO on pictures (issue #55) through TRL's GRPOTrainer with the tiny LFM2.5-VL: the prompts' pictures reach the
reward functions and the policy's forward pass (its vision encoder is updated: gradients flowed from the
log-probs through the pixels), the logged prompts show where each picture was, and rows with pictures are checked
before a model loads. The grounding example's IoU rising over a CPU run: docs/vision.md, measured."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from leap_finetune.errors import LeapError
from tests.conftest import EXAMPLES, write_config, write_jsonl

# A reward that records what TRL gives it (the pictures) and varies with the completion (advantages != 0: the
# policy is updated at every step)
RECORDER = """
import json
from pathlib import Path


def seen(completions, images=None, **_):
    text = [str(c[0].get("content") or "") if isinstance(c, list) and c else str(c or "") for c in completions]
    pictures = [[list(i.size) for i in row if hasattr(i, "size")] for row in images or [] if row]
    if pictures:  # (training's calls; validate's check of the function passes no pictures)
        with Path(__file__).with_name("seen.jsonl").open("a") as log:
            log.write(json.dumps({"sizes": pictures}) + "\\n")
    return [float(len(t) % 3) for t in text]
"""


def _grpo(workdir: Path) -> Path:
    shutil.copytree(EXAMPLES / "data" / "grounding_images" / "train", workdir / "grounding_images" / "train")
    rows = [json.loads(line) for line in (EXAMPLES / "data" / "grounding_prompts.jsonl").read_text().splitlines()]
    write_jsonl(workdir / "prompts.jsonl", rows[:8])
    (workdir / "recorder.py").write_text(RECORDER, encoding="utf-8")
    config = {
        "model_name": "tiny-lfm2.5-vl",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": {"funcs": ["./recorder.py::seen", "iou", "box_format"]},
        "training_config": {"extends": "DEFAULT_GRPO", "use_vllm": False, "max_steps": 2, "num_generations": 4,
                            "per_device_train_batch_size": 8, "max_completion_length": 8, "learning_rate": 1e-2,
                            "logging_steps": 1, "save_strategy": "no"},
    }  # fmt: skip
    return write_config(workdir, config)


@pytest.mark.slow
def test_grpo_on_pictures_feeds_them_to_the_rewards_and_the_policy(workdir):
    from safetensors.torch import load_file

    from leap_finetune.api import run_config
    from leap_finetune.models.lfm2_keys import published_vision_name
    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    summary = run_config(_grpo(workdir))
    run = Path(summary["run_dir"])
    seen = [json.loads(line) for line in (workdir / "seen.jsonl").read_text().splitlines()]
    assert seen and all(s["sizes"] and all(row == [[64, 64]] for row in s["sizes"]) for s in seen)  # its picture
    logged = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert logged and all("<image>" in str(entry["prompt"]) for entry in logged)
    assert summary["rollouts"]["engine"] == "leap-finetune sampler"  # (its prefill reads the pixels: test_sampler)
    # the vision encoder was trained: the loss's gradients reached it through the pictures
    built = build_tiny_model("tiny-lfm2.5-vl", load_tiny_tokenizer("tiny-lfm2.5-vl")).state_dict()
    base = {published_vision_name(k): v for k, v in built.items()}  # (saved in the published layout)
    trained = load_file(run / "model" / "model.safetensors")
    vision = [k for k in trained if "vision_tower" in k and k.endswith("weight") and trained[k].dim() == 2]
    assert vision and any(not torch.equal(trained[k].float(), base[k].float()) for k in vision)


def test_image_prompts_are_checked_before_a_model_loads(workdir):
    from leap_finetune.api import validate_config

    config = _grpo(workdir)
    broken = {"prompt": [{"role": "user", "content": [{"type": "image", "image": "grounding_images/nope.png"},
                                                       {"type": "text", "text": "Where is the red box?"}]}],
              "solution": "[1, 2, 3, 4]"}  # fmt: skip
    with (workdir / "prompts.jsonl").open("a") as rows:
        rows.write(json.dumps(broken) + "\n")
    with pytest.raises(LeapError) as err:
        validate_config(config)
    text = " ".join(err.value.format().split())
    assert "line 9" in text and "prompt[0].content[0]" in text and "nope.png" in text


def test_lfm2s_text_template_is_refused_for_pictures(workdir):
    from leap_finetune.api import validate_config

    config = _grpo(workdir)
    import yaml

    raw = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**raw, "chat_template": "lfm2"}))
    with pytest.raises(LeapError, match="'lfm2' .* does not render image parts"):
        validate_config(config)


def test_vllm_rollouts_are_refused_for_pictures(workdir):
    """vLLM's rollouts do not take the pictures yet: validate says so (not that vLLM is missing) and names the
    sampler, before any GPU time is spent."""
    from leap_finetune.api import validate_config

    config = _grpo(workdir)
    import yaml

    raw = yaml.safe_load(config.read_text())
    raw["training_config"]["use_vllm"] = True
    config.write_text(yaml.safe_dump(raw))
    with pytest.raises(LeapError) as err:
        validate_config(config)
    text = " ".join(err.value.format().split())
    assert (
        "GRPO on a vision-language model runs its rollouts on leap-finetune's sampler only" in text
        and "use_vllm: false" in text
    )


def test_grpo_on_pictures_takes_the_sampler_when_use_vllm_is_the_profiles(workdir):
    """DEFAULT_GRPO's use_vllm: true is the profile's, not the user's: on a vision-language model it becomes the
    sampler (the starter config validates as written) instead of a refusal."""
    from leap_finetune.api import validate_config

    config = _grpo(workdir)
    import yaml

    raw = yaml.safe_load(config.read_text())
    raw["training_config"].pop("use_vllm", None)
    raw["training_config"]["extends"] = "DEFAULT_GRPO"
    config.write_text(yaml.safe_dump(raw))
    from leap_finetune.validate.loader import load_config

    assert load_config(config).training["use_vllm"] is False
    validate_config(config)  # (and the whole check passes, rows included)
