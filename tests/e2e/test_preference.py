"""DPO and KTO end to end on the tiny models, through the bundled tiny examples: learning,
LoRA's reference model, precomputed reference log-probs, inspect, and the KTO rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from leap_finetune.api import run_config
from leap_finetune.data.chat_templates import official_template
from leap_finetune.data.preference_tokens import kto_balance_advice
from leap_finetune.models.tiny import load_tiny_tokenizer
from tests.conftest import EXAMPLES, invoke, write_config


def example(name: str, workdir: Path, **training) -> Path:
    """An example config, pointed at the bundled data, with training overrides."""
    config = yaml.safe_load((EXAMPLES / name).read_text())
    config["dataset"]["path"] = str(EXAMPLES / config["dataset"]["path"])
    config["training_config"].update(training)
    return write_config(workdir, config, name)


def metrics(summary: dict) -> list[dict]:
    return [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def count_model_loads(monkeypatch):
    from leap_finetune.models import loading

    calls = []
    original = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: calls.append(a[0]) or original(*a, **k))
    return calls


def test_dpo_full_fine_tune_held_out_reward_accuracy_rises(workdir, count_model_loads):
    summary = run_config(example("dpo_tiny.yaml", workdir))
    evals = [m for m in metrics(summary) if "eval_rewards/accuracies" in m]
    assert evals[0]["step"] == 0 and evals[0]["eval_rewards/accuracies"] <= 0.5
    assert evals[-1]["eval_rewards/accuracies"] >= 0.9
    assert evals[-1]["eval_rewards/margins"] > 0
    train = [m for m in metrics(summary) if "rewards/chosen" in m]
    assert train and {"rewards/rejected", "rewards/margins", "rewards/accuracies"} <= set(train[-1])
    assert count_model_loads == ["tiny-lfm2", "tiny-lfm2"]  # the policy and a frozen reference


def test_dpo_lora_uses_the_adapter_free_base_as_reference(workdir, count_model_loads):
    config = example("dpo_tiny.yaml", workdir, learning_rate=1e-2, max_steps=40)
    data = yaml.safe_load(config.read_text())
    data["peft_config"] = {"extends": "DEFAULT_LORA", "r": 16, "lora_alpha": 32}
    config.write_text(yaml.safe_dump(data))
    summary = run_config(config)
    assert count_model_loads == ["tiny-lfm2"]  # no second copy in memory
    evals = [m for m in metrics(summary) if "eval_rewards/accuracies" in m]
    assert evals[-1]["eval_rewards/accuracies"] >= 0.9
    assert (Path(summary["run_dir"]) / "adapter" / "adapter_config.json").exists()


def test_dpo_with_compiled_layers_and_bf16_kahan_learns_with_both_models_compiled(
    workdir, count_model_loads, monkeypatch
):
    """The GPU speed keys on DPO, forced here: every decoder layer of the policy and of the frozen reference goes
    through compile_layers, the weights are bf16 with torch-optimi's AdamW, and held-out reward accuracy still rises.
    compile_layers is replaced by a recorder of the models it is given: compiling both models on this CPU costs ~2.5
    minutes cold (inductor's C++ builds). The compiled DPO and KTO paths ran on the H200 (bench/preference_throughput.py,
    bench/RESULTS.md), and compiled layers train on this CPU in tests/recipes/test_speed.py."""
    from leap_finetune.recipes import speed

    compiled = []
    monkeypatch.setattr(speed, "compile_layers", lambda model: compiled.append(model) or len(compiled))
    summary = run_config(
        example("dpo_tiny.yaml", workdir, compile_layers=True, optimizer_precision="bf16_kahan", max_steps=20)
    )
    assert len(compiled) == 2 and compiled[0] is not compiled[1]  # the policy and the reference
    assert count_model_loads == ["tiny-lfm2", "tiny-lfm2"]
    evals = [m for m in metrics(summary) if "eval_rewards/accuracies" in m]
    assert evals[-1]["eval_rewards/accuracies"] >= 0.8 > evals[0]["eval_rewards/accuracies"]
    log = (Path(summary["run_dir"]) / "train.log").read_text()
    assert "torch.compile per decoder layer" in log and "compiled: ~" in log
    import torch
    from safetensors import safe_open

    with safe_open(str(Path(summary["run_dir"]) / "model" / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(k).dtype for k in list(weights.keys())[:5]} == {torch.bfloat16}


@pytest.mark.parametrize(
    "kind,lora,model", [("dpo", False, "tiny-lfm2"), ("dpo", True, "tiny-lfm2"), ("kto", False, "tiny-lfm2"),
                        ("dpo", False, "tiny-lfm2-moe")]
)  # fmt: skip
def test_padding_free_rows_train_like_padded_batches_step_by_step(workdir, monkeypatch, kind, lora, model):
    """models/flat_rows.py (the GPU default for LFM2 DPO and KTO): the padded batch runs through the model as one
    flat row padded to a multiple of 8 (KTO: its completions and its KL completions, each laid out from its own
    mask). Same losses, rewards and held-out numbers as the padded batches at every step; the model really received
    flat rows (one row, boundaries at each sequence, the padding gone)."""
    from leap_finetune.models import flat_rows

    seen = []
    original = flat_rows._flatten

    def recorded(module, args, kwargs):
        args, kwargs = original(module, args, kwargs)
        if kwargs.get("cu_seq_lens_q") is not None:
            seen.append((kwargs["input_ids"].shape, int(kwargs["cu_seq_lens_q"][-1])))
        return args, kwargs

    monkeypatch.setattr(flat_rows, "_flatten", recorded)
    runs = {}
    for padding_free in (False, True):
        config = example(
            f"{kind}_tiny.yaml", workdir, padding_free=padding_free, max_steps=6, logging_steps=1, eval_steps=3
        )
        data = yaml.safe_load(config.read_text())
        data["project_name"] = f"{kind}-flat-{padding_free}-{lora}"
        data["model_name"] = model  # (LFM2-MoE: its routers count the real tokens of the flat row, not the padding)
        if lora:
            data["peft_config"] = {"extends": "DEFAULT_LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.0}
        config.write_text(yaml.safe_dump(data))
        runs[padding_free] = metrics(run_config(config))
        if not padding_free:
            assert not seen  # (padding_free: false runs padded batches)
    assert seen and all(shape[0] == 1 and shape[1] % 8 == 0 and end == shape[1] for shape, end in seen)
    # every call of a step ran flat: DPO the policy and the reference; KTO also their KL completions (4 per step)
    assert len(seen) >= (4 if kind == "kto" else 2) * 6
    keys = ("loss", "rewards/chosen", "rewards/rejected", "eval_loss", "eval_rewards/margins", "kl", "eval_kl",
            "moe/aux_loss", "moe/routed_tokens", "moe/expert_load_max")  # fmt: skip
    for flat, padded in zip(runs[True], runs[False], strict=True):
        assert {k: flat[k] for k in keys if k in padded} == pytest.approx(
            {k: padded[k] for k in keys if k in padded}, rel=1e-4, abs=1e-5
        )
    assert sum("loss" in r for r in runs[True]) == 6


def test_kto_desirable_and_undesirable_rewards_separate(workdir):
    summary = run_config(example("kto_tiny.yaml", workdir))
    last = [m for m in metrics(summary) if "eval_rewards/chosen" in m][-1]
    assert last["eval_rewards/chosen"] - last["eval_rewards/rejected"] > 1.0
    assert "eval_kl" in last
    assert (Path(summary["run_dir"]) / "model" / "model.safetensors").exists()


def test_kto_with_precomputed_reference_log_probs_loads_one_model(workdir, count_model_loads):
    summary = run_config(example("kto_tiny.yaml", workdir, precompute_ref_log_probs=True, max_steps=10))
    assert count_model_loads == ["tiny-lfm2"]
    losses = [m["loss"] for m in metrics(summary) if "loss" in m]
    assert losses[-1] < losses[0]


def test_kto_batch_size_of_one_is_refused_before_any_model_loads(workdir):
    result = invoke("validate", str(example("kto_tiny.yaml", workdir, per_device_train_batch_size=1)), cwd=workdir)
    assert result.returncode == 2
    assert "KTO needs > 1" in result.stderr and "KL term" in result.stderr and "Traceback" not in result.stderr


def test_inspect_dpo_shows_prompt_and_completions_as_trained(workdir):
    result = invoke("inspect", str(example("dpo_tiny.yaml", workdir)), "--json", "--rows", "20", cwd=workdir)
    assert result.returncode == 0, result.stderr
    items = json.loads(result.stdout)
    lines = (EXAMPLES / "data" / "dpo.jsonl").read_text().splitlines()
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    tokenizer.chat_template = official_template("lfm2")
    seen = {"strings": 0, "multi-turn": 0, "implicit": 0}
    for item in items:
        row = json.loads(lines[int(item["source"]["location"].split()[1]) - 1])
        if "prompt" not in row:  # implicit: the shared user turn is the prompt
            seen["implicit"] += 1
            assert item["implicit_prompt"] is True
            prompt, chosen, rejected = row["chosen"][:1], row["chosen"][1]["content"], row["rejected"][1]["content"]
        elif isinstance(row["prompt"], str):
            seen["strings"] += 1
            prompt, chosen, rejected = [{"role": "user", "content": row["prompt"]}], row["chosen"], row["rejected"]
        else:
            seen["multi-turn"] += 1
            prompt, chosen, rejected = row["prompt"], row["chosen"][0]["content"], row["rejected"][0]["content"]
        assert item["prompt"] == tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        assert (item["chosen"], item["rejected"]) == (chosen + "<|im_end|>", rejected + "<|im_end|>")
    assert all(seen.values()), seen


def test_inspect_kto_shows_the_label(workdir):
    result = invoke("inspect", str(example("kto_tiny.yaml", workdir)), "--json", "--rows", "4", cwd=workdir)
    items = json.loads(result.stdout)
    assert {type(i["label"]) for i in items} == {bool}
    assert all(
        i["completion"].endswith("<|im_end|>") and i["prompt"].endswith("<|im_start|>assistant\n") for i in items
    )
    text = invoke("inspect", str(example("kto_tiny.yaml", workdir)), "--rows", "2", cwd=workdir)
    assert text.returncode == 0 and "label:" in text.stdout


@pytest.mark.parametrize(
    ("desirable", "undesirable", "advice"),
    [(50, 50, None), (60, 50, None), (90, 10, "set EITHER"), (10, 90, "set EITHER"), (10, 0, "no undesirable")],
)
def test_kto_balance_advice(desirable, undesirable, advice):
    result = kto_balance_advice([True] * desirable + [False] * undesirable, 1.0, 1.0)
    assert (result is None) if advice is None else (advice in result)


def test_extreme_kto_balance_is_warned_with_the_weights_to_set(workdir):
    rows = [{"prompt": f"q{i}", "completion": f"a{i}", "label": i % 10 != 0} for i in range(40)]
    (workdir / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = write_config(
        workdir, {"model_name": "tiny-lfm2", "training_type": "kto", "dataset": {"path": "kto.jsonl"}}
    )
    result = invoke("validate", str(config), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "36 desirable vs 4 undesirable" in " ".join(result.stderr.split())
    assert "undesirable_weight in [6.75, 9.00]" in " ".join(result.stderr.split())
