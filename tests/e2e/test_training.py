"""Real training runs of the tiny models through TRL's SFTTrainer: full, LoRA, packing, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from leap_finetune.api import run_config
from leap_finetune.errors import LeapError
from tests.conftest import StopAt, fact_rows, tiny_config, write_config, write_jsonl


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in _metrics(run_dir) if "loss" in m}


@pytest.fixture
def data(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    return workdir


def test_full_fine_tune_learns_and_saves_a_loadable_model(data):
    config = tiny_config(
        dataset={"path": "train.jsonl", "test_size": 8},
        training_config={"max_steps": 80, "eval_steps": 40, "learning_rate": 3e-3},
    )
    summary = run_config(write_config(data, config))
    run_dir = Path(summary["run_dir"])
    assert run_dir.parent == data / "outputs" / "test"
    assert summary["eval_loss"] < summary["initial_eval_loss"] * 0.5
    metrics = _metrics(run_dir)
    assert {"step", "loss", "learning_rate", "tokens_per_second"} <= set(metrics[1])
    assert [m["step"] for m in metrics if "eval_loss" in m][:2] == [0, 40]
    for name in ("resolved_config.yaml", "config.yaml", "checkpoint-80/leap_checkpoint_complete.json"):
        assert (run_dir / name).exists(), name
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say teal twice."}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=tokenizer.eos_token_id)
    assert tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip() == "teal teal"


def test_lora_trains_only_the_adapter_and_saves_adapter_and_merged_model(data):
    config = tiny_config(
        peft_config={"extends": "DEFAULT_LORA", "r": 8}, training_config={"max_steps": 12, "learning_rate": 5e-3}
    )
    summary = run_config(write_config(data, config))
    run_dir = Path(summary["run_dir"])
    adapter = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == {"q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3"}
    losses = _losses(run_dir)
    assert losses[12] < losses[1]
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    base = build_tiny_model("tiny-lfm2", load_tiny_tokenizer("tiny-lfm2"))
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, base.get_parameter(n))]
    assert changed and all(any(m in n for m in ("proj", "w1", "w2", "w3")) for n in changed)
    assert not any("embed" in n or "norm" in n for n in changed)


def test_packing_trains_with_exact_lfm2_packing(data):
    config = tiny_config(training_config={"packing": True, "max_steps": 10, "per_device_train_batch_size": 2})
    summary = run_config(write_config(data, config))
    losses = _losses(Path(summary["run_dir"]))
    assert losses[10] < losses[1]


def test_tiny_lfm2_5_trains(data):
    summary = run_config(write_config(data, tiny_config(model_name="tiny-lfm2.5", training_config={"max_steps": 3})))
    tokenizer = AutoTokenizer.from_pretrained(Path(summary["run_dir"]) / "model")
    assert "preserve_thinking" in tokenizer.chat_template  # LFM2.5's template travels with the model


def test_resume_reproduces_the_uninterrupted_losses(data):
    base = {"max_steps": 8, "save_steps": 100, "learning_rate": 2e-3, "lr_scheduler_type": "cosine"}
    full = run_config(write_config(data, tiny_config(project_name="full", training_config=base)))
    interrupted = run_config(
        write_config(data, tiny_config(project_name="resumed", training_config=base)), callbacks=[StopAt(3)]
    )
    assert interrupted.get("stopped_early") and interrupted["global_step"] == 3
    resumed = run_config(
        write_config(
            data, tiny_config(project_name="resumed", training_config={**base, "resume_from_checkpoint": "latest"})
        )
    )
    assert resumed["run_dir"] == interrupted["run_dir"]
    expected, got = _losses(Path(full["run_dir"])), _losses(Path(resumed["run_dir"]))
    assert sorted(got) == list(range(1, 9))
    for step in range(1, 9):
        assert got[step] == pytest.approx(expected[step], rel=1e-5), step


def test_resume_latest_without_a_checkpoint_is_a_clear_error(data):
    with pytest.raises(LeapError, match="no complete checkpoint"):
        run_config(
            write_config(data, tiny_config(project_name="none", training_config={"resume_from_checkpoint": "latest"}))
        )


def test_an_existing_non_empty_output_dir_is_refused(data):
    (data / "taken").mkdir()
    (data / "taken" / "file").write_text("x")
    with pytest.raises(LeapError, match="exists and is not empty"):
        run_config(write_config(data, tiny_config(output_dir="taken")))
    assert sorted(p.name for p in (data / "taken").iterdir()) == ["file"]


def test_bf16_weights_opt_in(data):
    summary = run_config(
        write_config(data, tiny_config(training_config={"max_steps": 2, "model_init_kwargs": {"dtype": "bfloat16"}}))
    )
    model = AutoModelForCausalLM.from_pretrained(Path(summary["run_dir"]) / "model")
    assert model.config.dtype == torch.bfloat16


def test_attention_implementation_opt_in(data):
    seen = []

    class Capture(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen.append(model.config._attn_implementation)

    run_config(
        write_config(
            data, tiny_config(training_config={"max_steps": 1, "model_init_kwargs": {"attn_implementation": "eager"}})
        ),
        callbacks=[Capture()],
    )
    assert seen == ["eager"]
