"""LFM2-MoE end to end on the built-in tiny-lfm2-moe (4 experts, 2 per token), from YAML through the real trainers:
SFT full and LoRA learn (held-out loss), the router metrics reach metrics.jsonl with loads that add up, LoRA adapts
the experts when asked, the merged model loads with transformers' own class, and DPO, KTO and GRPO train their
policy through the same routers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from leap_finetune.api import run_config
from tests.conftest import EXAMPLES, invoke, write_config

TOP_K = 2


def _metrics(summary: dict) -> list[dict]:
    return [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]


def _sft(workdir: Path, name: str, peft: dict | None = None, **training) -> Path:
    config = {
        "project_name": name,
        "model_name": "tiny-lfm2-moe",
        "training_type": "sft",
        "dataset": {"path": str(EXAMPLES / "data" / "quickstart.jsonl"), "test_size": 0.15},
        "training_config": {
            "extends": "DEFAULT_SFT",
            "num_train_epochs": 8,
            "per_device_train_batch_size": 8,
            "learning_rate": 3e-3,
            "logging_steps": 10,
            "eval_steps": 30,
            "max_length": 128,
            "save_strategy": "no",
            **training,
        },
    }
    if peft is not None:
        config["peft_config"] = peft
    return write_config(workdir, config, f"{name}.yaml")


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    return run_config(_sft(tmp_path_factory.mktemp("moe-full"), "moe-full"))


def test_a_full_fine_tune_learns_and_logs_router_metrics_that_add_up(full_run):
    records = _metrics(full_run)
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert evals[-1] <= evals[0] / 2
    train = [r for r in records if "loss" in r]
    assert all({"moe/aux_loss", "moe/expert_load_min", "moe/expert_load_max", "moe/expert_load_entropy"} <= set(r)
               for r in train)  # fmt: skip
    for r in train:
        assert r["moe/aux_loss"] >= 1.0 - 1e-6  # (1.0 at an even load; never below)
        assert 0 <= r["moe/expert_load_min"] <= 1 <= r["moe/expert_load_max"] <= 4
        assert 0 < r["moe/expert_load_entropy"] <= 1
    # each routed layer sees every trained token, each token choosing TOP_K experts
    seen = [r["num_input_tokens_seen"] for r in train]
    steps = [seen[0]] + [b - a for a, b in zip(seen, seen[1:], strict=False)]
    assert [r["moe/routed_tokens"] for r in train] == [int(s) * TOP_K for s in steps]
    assert (Path(full_run["run_dir"]) / "plots" / "experts.png").stat().st_size > 0


def test_the_trained_model_loads_with_transformers_own_class(full_run):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(full_run["model_dir"])
    assert type(model).__name__ == "Lfm2MoeForCausalLM"
    assert model.config.num_experts == 4 and model.config.conv_dim == model.config.hidden_size  # (vLLM's keys too)
    card = (Path(full_run["model_dir"]) / "README.md").read_text()
    total = sum(p.numel() for p in model.parameters())
    assert f"| parameters | {total:,} (" in card and "active per token: 2 of 4 experts" in card
    assert "| router losses | load-balancing" in card


def test_lora_with_lora_experts_adapts_the_experts_and_merges(workdir):
    from transformers import AutoModelForCausalLM

    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    config = _sft(workdir, "moe-lora", {"extends": "DEFAULT_LORA", "lora_experts": True}, num_train_epochs=6)
    result = invoke("run", str(config), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "experts (last log)" in result.stderr and "x the even share" in " ".join(result.stderr.split())
    assert "mixture of experts: 4 experts, 2 per token, 3 routed layers" in result.stderr
    [run] = list((workdir / "outputs" / "moe-lora").iterdir())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert evals[-1] < evals[0] - 1.0
    merged = AutoModelForCausalLM.from_pretrained(run / "model")
    base = build_tiny_model("tiny-lfm2-moe", load_tiny_tokenizer("tiny-lfm2-moe"))
    experts = "model.layers.2.feed_forward.experts.gate_up_proj"
    moved = merged.state_dict()[experts] - base.state_dict()[experts].to(merged.dtype)
    assert moved.abs().max() > 1e-4  # the experts' adapters were trained and merged into them
    assert torch.equal(merged.state_dict()["model.embed_tokens.weight"], base.state_dict()["model.embed_tokens.weight"])


def _example(name: str, workdir: Path, **training) -> Path:
    config = yaml.safe_load((EXAMPLES / name).read_text())
    config["model_name"] = "tiny-lfm2-moe"
    config["dataset"]["path"] = str(EXAMPLES / config["dataset"]["path"])
    config["training_config"].update(training)
    return write_config(workdir, config, name)


@pytest.mark.parametrize(("example", "metric"), [("dpo_tiny.yaml", "rewards/margins"), ("kto_tiny.yaml", "kl")])
def test_dpo_and_kto_train_the_moe_policy_through_its_routers(workdir, example, metric):
    summary = run_config(_example(example, workdir, max_steps=12, logging_steps=4, eval_strategy="no"))
    train = [r for r in _metrics(summary) if "loss" in r]
    assert train and all("moe/aux_loss" in r for r in train)  # (the policy's forwards, not the reference's)
    assert train[-1]["loss"] < train[0]["loss"]
    assert metric in train[-1]


def test_grpo_rollouts_and_training_run_through_the_moe(workdir):
    config = {
        "project_name": "moe-grpo",
        "model_name": "tiny-lfm2-moe",
        "training_type": "grpo",
        "dataset": {"path": str(EXAMPLES / "data" / "colors_prompts.jsonl")},
        "rewards": ["accuracy"],
        "training_config": {
            "extends": "DEFAULT_GRPO",
            "use_vllm": False,
            "max_steps": 3,
            "per_device_train_batch_size": 8,
            "num_generations": 4,
            "max_completion_length": 6,
            "logging_steps": 1,
            "save_strategy": "no",
            "router_z_loss_coef": 0.001,
        },
    }
    summary = run_config(write_config(workdir, config, "grpo.yaml"))
    train = [r for r in _metrics(summary) if "rewards/accuracy/mean" in r]
    assert len(train) == 3
    assert all("moe/aux_loss" in r and "moe/z_loss" in r for r in train)


def test_gguf_auto_is_refused_for_a_mixture_of_experts_before_anything_is_written(full_run, workdir):
    """transformers cannot read an LFM2-MoE GGUF file back, so no rung of --gguf auto could be judged."""
    result = invoke("export", full_run["run_dir"], "--gguf", "auto", "-o", str(workdir / "auto"))
    assert result.returncode == 2 and "cannot read a mixture-of-experts (LFM2-MoE) GGUF" in result.stderr
    assert not (workdir / "auto").exists()
