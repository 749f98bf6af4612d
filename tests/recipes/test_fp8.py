"""`training_config.precision: fp8` (recipes/fp8.py): the decoder's FP8-sized linear layers become torchao's
Float8Linear - not the output layer, not a layer whose sizes FP8 GEMMs cannot take - LoRA wraps them, and a run trains
through them from YAML: its loss falls, the run says how many layers, and the saved model is a plain transformers
model. There is no GPU here: torch emulates the FP8 matmuls on the CPU with the same rounding (the speed is measured
by bench/sft_throughput.py --variants default,fp8 on a GPU). What cannot work is refused before a model loads.
torchao is on the path of these tests only (scripts/setup.sh keeps it in .venv/fp8: installed in .venv, peft would
import it in every process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, fact_rows, invoke, tiny_config, write_config, write_jsonl

FP8_SITE = REPO / ".venv" / "fp8"


@pytest.fixture
def torchao_here(monkeypatch):
    """torchao importable in this test process (from .venv/fp8)."""
    assert (FP8_SITE / "torchao").is_dir(), "scripts/setup.sh installs torchao in .venv/fp8"
    monkeypatch.syspath_prepend(str(FP8_SITE))


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory) -> Path:
    """A 2-layer LFM2 (a convolution layer, an attention layer) whose linear layers are FP8-sized: hidden 1024."""
    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    arch = {"hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": 2}
    arch.update(layer_types=["conv", "full_attention"], num_attention_heads=8, num_key_value_heads=2)
    model = build_tiny_model("tiny-lfm2", tokenizer, arch=arch)
    folder = tmp_path_factory.mktemp("wide") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_the_fp8_sized_layers_become_float8_and_lora_wraps_them(wide_model, torchao_here):
    from peft import LoraConfig, get_peft_model
    from torchao.float8.float8_linear import Float8Linear
    from transformers import AutoModelForCausalLM

    from leap_finetune.recipes.fp8 import use_fp8

    model = AutoModelForCausalLM.from_pretrained(wide_model, dtype=torch.float32)
    count = use_fp8(model)
    converted = {name for name, module in model.named_modules() if isinstance(module, Float8Linear)}
    assert count == len(converted) > 0
    attention = "model.layers.1.self_attn"
    assert f"{attention}.q_proj" in converted and f"{attention}.out_proj" in converted
    assert f"{attention}.k_proj" not in converted  # (256 outputs: under MIN_FEATURES, FP8 would cost more)
    assert "model.layers.0.feed_forward.w1" in converted and "model.layers.0.conv.in_proj" in converted
    assert not isinstance(model.get_output_embeddings(), Float8Linear)  # (the logits stay bf16)
    lora = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "w1"]))
    wrapped = lora.base_model.model.model.layers[1].self_attn.q_proj
    assert isinstance(wrapped.base_layer, Float8Linear)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    loss = lora(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and wrapped.lora_B["default"].weight.grad.abs().sum() > 0


def test_a_run_trains_through_fp8_layers(wide_model, tmp_path, torchao_here):
    write_jsonl(tmp_path / "train.jsonl", fact_rows(32))
    config = tiny_config(model_name=str(wide_model))
    config["training_config"].update(precision="fp8", max_steps=8, learning_rate=3e-4, max_length=64)
    summary = invoke("run", str(write_config(tmp_path, config)))
    said = summary.stdout + summary.stderr
    assert summary.returncode == 0, said
    assert "note: training_config.precision fp8 on the CPU: torch emulates the FP8 matmuls" in said
    assert "precision: fp8 matmuls in" in said
    run_dir = next((tmp_path / "outputs" / "test").iterdir())
    losses = [
        json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"loss"' in line
    ]
    assert losses[-1] < 0.8 * losses[0], losses
    saved = json.loads((run_dir / "model" / "config.json").read_text())
    assert saved["architectures"] == ["Lfm2ForCausalLM"]  # (a plain model: the FP8 casts are not saved)


@pytest.mark.parametrize(
    ("training", "peft", "said"),
    [
        ({"precision": "fp8", "fp16": True}, None, "fp8 runs under bf16 autocast"),
        ({"precision": "fp4"}, None, "precision"),
    ],
)
def test_what_cannot_work_is_refused_before_a_model_loads(tmp_path, training, peft, said, torchao_here):
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    config = tiny_config()
    config["training_config"].update(training)
    if peft:
        config["peft_config"] = peft
    result = invoke("validate", str(write_config(tmp_path, config)))
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_fp8_over_a_quantized_base_is_refused():
    """(bitsandbytes, which QLoRA needs at validate, is not in the test environment: the driver's check itself)"""
    from types import SimpleNamespace

    from leap_finetune.errors import LeapError
    from leap_finetune.launch.checks import check_fp8
    from leap_finetune.launch.devices import plan_devices

    qlora = {"precision": "fp8", "model_init_kwargs": {"quantization_config": {"load_in_4bit": True}}}
    resolved = SimpleNamespace(training=qlora, config_path="config.yaml")
    with pytest.raises(LeapError, match=r"quantized to 4 or 8 bits \(QLoRA\)"):
        check_fp8(resolved, plan_devices(gpus=1), console=None)


def test_without_torchao_the_error_gives_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao", None)  # (not importable here, as in the suite's .venv itself)
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    config = tiny_config()
    config["training_config"]["precision"] = "fp8"
    result = invoke("validate", str(write_config(tmp_path, config)))
    assert result.returncode == 2, result.stderr
    assert "pip install 'leap-finetune[fp8]'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("training", "said"),
    [
        ({"fp16": True}, "fp8 runs under bf16 autocast"),
        ({"model_init_kwargs": {"quantization_config": {"load_in_4bit": True}}}, "quantized to 4 or 8 bits"),
    ],
)
def test_without_torchao_a_conflict_in_the_config_is_said_first(tmp_path, monkeypatch, training, said):
    """Installing torchao would not make these work: the conflict is the message, not the install line."""
    monkeypatch.setitem(sys.modules, "torchao", None)
    from leap_finetune.errors import LeapError
    from leap_finetune.launch.checks import check_fp8
    from leap_finetune.launch.devices import plan_devices

    if "fp16" in training:
        write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
        config = tiny_config()
        config["training_config"].update(precision="fp8", **training)
        result = invoke("validate", str(write_config(tmp_path, config)))
        assert result.returncode == 2 and said in result.stderr and "pip install" not in result.stderr
        return
    from types import SimpleNamespace

    resolved = SimpleNamespace(training={"precision": "fp8", **training}, config_path="config.yaml")
    with pytest.raises(LeapError, match=said):
        check_fp8(resolved, plan_devices(gpus=1), console=None)
