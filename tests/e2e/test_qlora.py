"""QLoRA runs through the CLI with bitsandbytes installed (scripts/setup.sh keeps it in .venv/qlora, on the path of
these processes only: installed in .venv it would be imported by every process that imports peft). bitsandbytes
quantizes and trains 4-bit bases on CPUs too; the GPU figures are in docs/memory.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.conftest import EXAMPLES, REPO, fact_rows, run_cli, tiny_config, write_config, write_jsonl

pytestmark = pytest.mark.slow
QLORA_SITE = REPO / ".venv" / "qlora"


def _qlora_cli(*args: str, cwd: Path):
    assert (QLORA_SITE / "bitsandbytes").is_dir(), "scripts/setup.sh installs bitsandbytes in .venv/qlora"
    result = run_cli(*args, cwd=cwd, env={"PYTHONPATH": str(QLORA_SITE)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return " ".join(result.stderr.split())  # (the console writes to stderr; stdout is for data)


def _run_dir(workdir: Path, project: str) -> Path:
    (run_dir,) = (workdir / "outputs" / project).iterdir()
    return run_dir


def test_qlora_sft_learns_over_a_4_bit_base_and_saves_the_adapter_merged_into_the_bf16_base(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    config = tiny_config(
        dataset={"path": "train.jsonl", "test_size": 8},
        peft_config={"extends": "DEFAULT_QLORA", "r": 8},
        training_config={"max_steps": 40, "eval_steps": 40, "learning_rate": 1e-2},
    )
    out = _qlora_cli("run", str(write_config(workdir, config)), cwd=workdir)
    # what bitsandbytes quantized as the model loaded (not what the config asked): tiny-lfm2's 24 linear layers
    assert "quantized base: 24 linear layers in nf4 (bitsandbytes)" in out
    assert "QLoRA (nf4) r=8" in out
    run_dir = _run_dir(workdir, "test")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_loss"] < summary["initial_eval_loss"] * 0.9
    assert "QLoRA (nf4)" in (run_dir / "README.md").read_text()
    assert "quantization_config" not in json.loads((run_dir / "model" / "config.json").read_text())
    # model/ is the adapter merged into the unquantized bf16 base (merging into the 4-bit weights would round the
    # whole layer to 4 bits: ~7% of its largest weight, against bf16's 0.4%)
    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    base = build_tiny_model("tiny-lfm2", load_tiny_tokenizer("tiny-lfm2")).to(torch.bfloat16)
    adapter = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    name = "model.layers.0.feed_forward.w1"
    with safe_open(f"{run_dir}/adapter/adapter_model.safetensors", "pt") as saved:
        a = saved.get_tensor(f"base_model.model.{name}.lora_A.weight").float()
        b = saved.get_tensor(f"base_model.model.{name}.lora_B.weight").float()
    with safe_open(f"{run_dir}/model/model.safetensors", "pt") as saved:
        merged = saved.get_tensor(f"{name}.weight")
    assert merged.dtype == torch.bfloat16
    delta = (b @ a) * adapter["lora_alpha"] / adapter["r"]
    assert delta.abs().max() > 1e-3  # (the adapter learned something to merge)
    expected = base.get_parameter(f"{name}.weight").float() + delta
    assert (merged.float() - expected).abs().max() <= 0.01 * expected.abs().max()


def test_qlora_on_a_vision_language_model_quantizes_the_language_model_only(workdir):
    config = (EXAMPLES / "vl_sft_images.yaml").read_text().replace("path: data/", f"path: {EXAMPLES / 'data'}/")
    config = config.replace("num_train_epochs: 12", "max_steps: 4").replace("eval_steps: 36", "eval_steps: 4")
    config = config.replace("samples: 2", "samples: 0").replace("save_steps: 72", "save_steps: 100")
    config += "\npeft_config:\n  extends: DEFAULT_QLORA\n"
    (workdir / "vl.yaml").write_text(config)
    out = _qlora_cli("run", str(workdir / "vl.yaml"), cwd=workdir)
    # the same 24 linear layers of its language model; the vision tower's and the projector's stay bf16
    assert "quantized base: 24 linear layers in nf4 (bitsandbytes)" in out
    run_dir = _run_dir(workdir, "vl_sft_images")
    with safe_open(f"{run_dir}/adapter/adapter_model.safetensors", "pt") as adapter:
        assert all("language_model" in name for name in adapter.keys())
    assert (run_dir / "model" / "model.safetensors").exists()


def test_qlora_dpo_trains_with_the_adapter_off_as_its_reference(workdir):
    config = (EXAMPLES / "dpo_tiny.yaml").read_text().replace("path: data/", f"path: {EXAMPLES / 'data'}/")
    config = config.replace("max_steps: 30", "max_steps: 10").replace("eval_steps: 15", "eval_steps: 10")
    config += "\npeft_config:\n  extends: DEFAULT_QLORA\n"
    (workdir / "dpo.yaml").write_text(config)
    out = _qlora_cli("run", str(workdir / "dpo.yaml"), cwd=workdir)
    assert "quantized base: 24 linear layers in nf4 (bitsandbytes)" in out
    summary = json.loads((_run_dir(workdir, "dpo-tiny") / "summary.json").read_text())
    assert summary["eval_loss"] < summary["initial_eval_loss"]  # (0.693 at the start: the adapter starts at zero)


def test_the_qlora_example_loads_and_the_planner_fits_lfm2_2_6b_into_its_16_gib(workdir):
    """examples/sft_lfm2_qlora.yaml as written (its Hub dataset is not read: load_config checks the config), with
    bitsandbytes on the path; LFM2-2.6B's shape from its published architecture (nothing downloaded)."""
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from leap_finetune.validate.loader import load_config\n"
        "from leap_finetune.memory.budget import fit_to_budget\n"
        "r = load_config(sys.argv[1])\n"
        "f = fit_to_budget(r, r.gpu_memory)\n"
        "q = r.training['model_init_kwargs']['quantization_config']\n"
        "print(json.dumps({'fits': f.fits, 'changes': [c.key for c in f.changes], 'peak': f.memory.peak,\n"
        "    'budget': r.gpu_memory, 'quant': q.get('bnb_4bit_quant_type'), 'model': r.model_id}))\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(QLORA_SITE), "HF_HUB_OFFLINE": "1"}
    example = EXAMPLES / "sft_lfm2_qlora.yaml"
    done = subprocess.run([sys.executable, "-c", script, str(example)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["model"].endswith("LFM2-2.6B") and found["quant"] == "nf4" and found["budget"] == 16 * 2**30
    # (a halved micro-batch, not checkpointing: the 4-bit base leaves room; LoRA over a bf16 base checkpoints there)
    assert found["fits"] and found["changes"] == ["per_device_train_batch_size"]
    assert 10 * 2**30 < found["peak"] < 14.2 * 2**30  # (14.2 GiB: what a 16 GiB card leaves for the process)


def test_qlora_on_an_lfm2_moe_quantizes_its_linear_layers_and_trains_with_its_routers(workdir):
    """tiny-lfm2-moe over a 4-bit base: bitsandbytes quantizes its 15 linear layers (the experts are 3-D weights
    and stay bf16, as the note says); the run learns and logs the routers' metrics."""
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    config = tiny_config(
        model_name="tiny-lfm2-moe",
        dataset={"path": "train.jsonl", "test_size": 8},
        peft_config={"extends": "DEFAULT_QLORA", "r": 8},
        training_config={"max_steps": 30, "eval_steps": 30, "learning_rate": 1e-2, "logging_steps": 10},
    )
    out = _qlora_cli("run", str(write_config(workdir, config)), cwd=workdir)
    assert "quantized base: 15 linear layers in nf4 (bitsandbytes)" in out
    assert "the experts of a mixture of experts are 3-D weights and stay bf16" in out
    run_dir = _run_dir(workdir, "test")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_loss"] < summary["initial_eval_loss"] * 0.9
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("moe/aux_loss" in r for r in records)
