"""Quantization-aware training (models/qat.py): the fake quantization is llama.cpp's q4_0 / q8_0 value for value
(the gguf package's port of ggml-quants.c is the reference), its gradient passes straight through, a LoRA layer
trains merged through the rounding, start_step switches it on, and `qat:` is checked at validate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from leap_finetune.models import qat
from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer
from tests.conftest import invoke, write_config

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "data" / "quickstart.jsonl"


@pytest.mark.parametrize("target", ["q4_0", "q8_0"])
def test_the_fake_quantization_is_llama_cpps_value_for_value(target):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    kind = {"q4_0": GGMLQuantizationType.Q4_0, "q8_0": GGMLQuantizationType.Q8_0}[target]
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((16, 256)) * rng.uniform(1e-3, 3, (16, 1))).astype(np.float32)
    weight[0, :32] = 0  # (a block of zeros: scale 0)
    weight[1, 5] = -7.0  # (a negative extreme: q4_0's scale takes its sign)
    expected = dequantize(quantize(weight, kind), kind)
    assert np.array_equal(qat.quantized(torch.from_numpy(weight), target).numpy(), expected)


def test_q8_0_rounds_as_c_roundf_at_the_edge_below_one_half():
    """0.49999997 (the float below 0.5) rounds to 0 in C's roundf and gguf's port; floor(x + 0.5) would give 1."""
    below_half = float(np.nextafter(np.float32(0.5), np.float32(0)))
    weight = torch.zeros(1, 32)
    weight[0, 0], weight[0, 1] = 127.0, below_half  # (scale 1: the value itself is rounded)
    assert qat.quantized(weight, "q8_0")[0, 1].item() == 0.0


def test_the_gradient_passes_straight_through():
    weight = torch.randn(8, 64, requires_grad=True)
    out = qat.fake_quant(weight, "q4_0")
    assert torch.equal(out.detach(), qat.quantized(weight.detach(), "q4_0"))
    out.sum().backward()
    assert torch.equal(weight.grad, torch.ones_like(weight))


def _loss(model, rows) -> float:
    """The mean loss per trained token over prepared rows."""
    total, tokens = 0.0, 0
    for row in rows:
        labels = torch.tensor([row["labels"]])
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([row["input_ids"]]), labels=labels).loss
        count = int((labels[:, 1:] != -100).sum())
        total, tokens = total + loss.item() * count, tokens + count
    return total / tokens


def _round_to(model, target: str) -> None:
    """The weights as the exported file holds them: every linear layer but the LM head (tied to the embedding)."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if "lm_head" not in name and qat.can_quantize(module, target):
                module.weight.copy_(qat.quantized(module.weight, target))


def _model():
    return build_tiny_model("tiny-lfm2", load_tiny_tokenizer("tiny-lfm2")).eval()


def test_every_block_aligned_linear_layer_runs_through_the_rounding_from_start_step():
    model = _model()
    ids = torch.randint(20, 300, (2, 12))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    state, patched = qat.apply(model, "q4_0", start_step=5)
    assert patched == 24  # (tiny-lfm2's linear layers; not the LM head)
    assert not state.active
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain)  # (before start_step: plain training)
        state.active = True
        quantized = model(input_ids=ids).logits
        reference = _model()
        _round_to(reference, "q4_0")
        torch.testing.assert_close(quantized, reference(input_ids=ids).logits)  # (what ships, exactly)


def test_a_lora_layer_trains_merged_through_the_rounding():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["w1"], lora_dropout=0.0))
    layer = model.base_model.model.model.layers[0].feed_forward.w1
    torch.nn.init.normal_(layer.lora_B["default"].weight)
    state, patched = qat.apply(model, "q4_0", start_step=0)
    assert patched == 24  # (each LoRA layer once, merged: not its base layer, nor the adapters' own linear layers)
    assert "forward" not in layer.lora_A["default"].__dict__ and "forward" not in layer.base_layer.__dict__
    x = torch.randn(3, layer.base_layer.in_features, requires_grad=True)
    merged = layer.base_layer.weight + layer.lora_B["default"].weight @ layer.lora_A["default"].weight * 2.0
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, qat.quantized(merged, "q4_0")))
    layer(x).sum().backward()
    assert layer.lora_A["default"].weight.grad.abs().sum() > 0  # (the adapters learn through it)
    assert layer.base_layer.weight.grad is None  # (the base stays frozen)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"qat": {"target": "q4_k_m"}}, "q4_k_m"),
        ({"qat": {"target": "q4_0", "start_step": -1}}, "start_step"),
        ({"qat": {"target": "q4_0"}, "model_name": "tiny-lfm2.5-vl"}, "vision-language models are not offered"),
        ({"qat": {"target": "q4_0"}, "model_name": "tiny-lfm2-moe"}, "experts are 3-D weights"),
        ({"qat": {"target": "q4_0"}, "peft_config": {"use_dora": True}}, "DoRA's magnitude"),
        (
            {
                "qat": {"target": "q4_0"},
                "training_type": "grpo",
                "rewards": ["accuracy"],
                "training_config": {"use_vllm": True},
            },
            "vLLM's rollouts",
        ),
        (
            {
                "qat": {"target": "q4_0"},
                "async_eval": {"mode": "sidecar"},
                "evals": {"benchmarks": [{"name": "b", "path": str(QUICKSTART), "metric": "exact_match"}]},
            },
            "async_eval.mode: sync",
        ),
        ({"qat": {"target": "mlx_q4"}}, "mlx_q4"),
        ({"qat": {"target": "q4_0"}, "training_type": "embedding"}, "trains an encoder"),
    ],
)
def test_qat_mistakes_are_refused_at_validate(workdir, extra, said):
    config = {"project_name": "qat", "model_name": "tiny-lfm2", "training_type": "sft",
              "dataset": {"path": str(QUICKSTART)}, **extra}  # fmt: skip
    result = invoke("validate", str(write_config(workdir, config)))
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr


def test_a_qat_run_evaluates_the_model_it_ships(workdir):
    """From YAML: the run says what it quantizes, and its final eval loss is the loss of the saved weights rounded
    to q4_0 (the file `export --gguf q4_0` writes holds exactly those values)."""
    import json

    from transformers import AutoModelForCausalLM

    config = {
        "project_name": "qat",
        "model_name": "tiny-lfm2",
        "training_type": "sft",
        "dataset": {"path": str(QUICKSTART), "test_size": 0.15},
        "qat": {"target": "q4_0", "start_step": 10},
        "training_config": {"extends": "DEFAULT_SFT", "max_steps": 30, "learning_rate": 3e-3, "eval_steps": 30,
                            "logging_steps": 10, "save_strategy": "no", "per_device_train_batch_size": 8,
                            "per_device_eval_batch_size": 64},  # (one eval batch: its loss is the mean per token)
    }  # fmt: skip
    result = invoke("run", str(write_config(workdir, config)), cwd=workdir)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stderr.split())
    assert "quantization-aware training: 24 linear layers through llama.cpp q4_0" in text and "from step 10" in text
    [run] = list((workdir / "outputs" / "qat").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    from datasets import load_from_disk

    rows = load_from_disk(str(run / "prepared" / "eval"))
    model = AutoModelForCausalLM.from_pretrained(run / "model", dtype=torch.float32).eval()
    latent = _loss(model, rows)
    _round_to(model, "q4_0")
    shipped = _loss(model, rows)
    assert summary["eval_loss"] == pytest.approx(shipped, rel=1e-4)
    assert abs(latent - shipped) > 1e-3  # (the rounding shows: the run did not measure the unrounded weights)
    assert "trained for q4_0" in (run / "README.md").read_text()


@pytest.mark.parametrize("example", ["dpo_tiny.yaml", "grpo"])
def test_dpo_and_grpo_train_through_the_rounding(workdir, example):
    """qat: with DPO (LoRA: each adapted layer merged through the rounding) and GRPO: the runs say what they
    quantize and train."""
    import yaml

    examples = Path(__file__).resolve().parents[2] / "examples"
    if example == "grpo":
        config = {
            "project_name": "qat-grpo", "model_name": "tiny-lfm2", "training_type": "grpo",
            "dataset": {"path": str(examples / "data" / "colors_prompts.jsonl")}, "rewards": ["accuracy"],
            "training_config": {"extends": "DEFAULT_GRPO", "use_vllm": False, "max_steps": 3, "logging_steps": 1,
                                "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 6,
                                "save_strategy": "no"},
        }  # fmt: skip
    else:
        config = yaml.safe_load((examples / example).read_text())
        config["dataset"]["path"] = str(examples / config["dataset"]["path"])
        config["training_config"].update(max_steps=6, logging_steps=2, eval_strategy="no", save_strategy="no")
        config["peft_config"] = {"extends": "DEFAULT_LORA", "lora_dropout": 0.0}
    config["qat"] = {"target": "q8_0"}
    result = invoke("run", str(write_config(workdir, config)), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "quantization-aware training: 24 linear layers through llama.cpp q8_0" in " ".join(result.stderr.split())


def test_the_rollout_copy_samples_from_the_rounded_weights_switched_with_training():
    """GRPO's sampler decodes with a copy of the policy: under qat its layers round as the policy's do, and the
    start_step switch of the training reaches the copy."""
    from leap_finetune.rl.sampler import rollout_copy

    model = _model()
    state, _ = qat.apply(model, "q4_0", start_step=3)
    shadow = rollout_copy(model, torch.float32)
    ids = torch.randint(20, 300, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(shadow(input_ids=ids).logits, model(input_ids=ids).logits)  # (off: plain)
        state.active = True
        rounded = model(input_ids=ids).logits
        torch.testing.assert_close(shadow(input_ids=ids).logits, rounded)
        reference = _model()
        _round_to(reference, "q4_0")
        torch.testing.assert_close(rounded, reference(input_ids=ids).logits)


def test_the_planner_counts_the_rounded_weights_kept_for_the_backward():
    """Without autocast (bf16 weights: LoRA's bf16 base, bf16_kahan) the forward keeps each rounded linear weight
    for the backward; with float32 weights the autocast copy it replaces was already counted."""
    from leap_finetune.memory.estimate import Setup, _linear_parameters, training_memory
    from leap_finetune.memory.shapes import model_shape

    shape = model_shape("LiquidAI/LFM2-1.2B")
    bf16 = {"tokens": 8192, "logit_tokens": 8192, "weight_bytes": 2, "lora_parameters": 0}
    plain, rounded = training_memory(shape, Setup(**bf16)), training_memory(shape, Setup(**bf16, qat=True))
    assert rounded.weights - plain.weights == 2 * _linear_parameters(shape)
    fp32 = {**bf16, "weight_bytes": 4}
    assert training_memory(shape, Setup(**fp32, qat=True)).peak == training_memory(shape, Setup(**fp32)).peak
