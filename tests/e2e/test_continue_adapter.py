"""`adapter_path` (docs/continue.md): a LoRA run's adapter trained further on new data - its shape is its own, the
continued run's first eval loss is the adapter's last, the run records where it came from; DPO from an SFT LoRA
has the base plus that adapter as its reference; a peft_config that would change the adapter, a missing folder and
a full fine-tune are refused at validate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from leap_finetune.api import run_config
from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("adapter")
    write_jsonl(folder / "train.jsonl", fact_rows(48))
    write_jsonl(folder / "val.jsonl", fact_rows(8))
    config = tiny_config(
        project_name="first",
        dataset={"path": "train.jsonl", "val_path": "val.jsonl"},
        peft_config={"extends": "DEFAULT_LORA", "r": 4, "lora_alpha": 8},
        training_config={"max_steps": 12, "eval_steps": 12, "learning_rate": 3e-3, "save_strategy": "no"},
    )
    return folder, run_config(write_config(folder, config, "first.yaml"))


def test_a_lora_adapter_is_trained_further_from_where_it_stopped(lora_run):
    folder, first = lora_run
    config = tiny_config(
        project_name="second",
        adapter_path=first["run_dir"],  # (the run folder: its adapter/)
        dataset={"path": "train.jsonl", "val_path": "val.jsonl"},
        training_config={"max_steps": 12, "eval_steps": 12, "learning_rate": 3e-3, "save_strategy": "no"},
    )
    second = run_config(write_config(folder, config, "second.yaml"))
    assert second["initial_eval_loss"] == pytest.approx(first["eval_loss"], rel=1e-4)
    assert second["eval_loss"] < second["initial_eval_loss"]
    adapter = json.loads((Path(second["run_dir"]) / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8  # (the adapter's shape, not DEFAULT_LORA's)
    resolved = yaml.safe_load((Path(second["run_dir"]) / "resolved_config.yaml").read_text())
    assert resolved["adapter_path"] == str(Path(first["run_dir"]) / "adapter")


def test_dpo_continues_an_sft_adapter(lora_run):
    folder, first = lora_run
    write_jsonl(folder / "pairs.jsonl", [{"prompt": f"Say {w} twice.", "chosen": f"{w} {w}", "rejected": "no"}
                                         for w in ("red", "blue", "gold", "teal")] * 4)  # fmt: skip
    config = tiny_config(
        project_name="dpo",
        training_type="dpo",
        adapter_path=str(Path(first["run_dir"]) / "adapter"),
        dataset={"path": "pairs.jsonl"},
        training_config={"extends": "DEFAULT_DPO", "max_steps": 4, "save_strategy": "no", "learning_rate": 1e-4},
    )
    summary = run_config(write_config(folder, config, "dpo.yaml"))
    logs = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    first_step = next(r for r in logs if "rewards/margins" in r)
    # the reference is the base plus the SFT adapter: at the first step the policy equals it, margins start at 0
    assert abs(first_step["rewards/margins"]) < 1e-3, first_step
    # reference_adapter: false - the bare base (the adapter switched off): the adapter's own preferences show at once
    config["training_config"] = {**config["training_config"], "reference_adapter": False}
    config["project_name"] = "dpo-bare-base"
    bare = run_config(write_config(folder, config, "dpo-bare.yaml"))
    logs = [json.loads(line) for line in (Path(bare["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert abs(next(r for r in logs if "rewards/margins" in r)["rewards/margins"]) > 1e-2


def test_grpo_from_an_sft_adapter_has_the_base_plus_that_adapter_as_its_kl_reference(lora_run):
    """beta > 0: the KL term's reference is the base plus the SFT adapter (the policy starts on it: KL 0 at the first
    step), not TRL's default for a peft model, the base with the adapter off; `reference_adapter: false` asks for
    that."""
    folder, _ = lora_run
    sft = tiny_config(  # (an adapter without dropout: the policy's log-probs are then exactly the merged copy's)
        project_name="sft-no-dropout",
        dataset={"path": "train.jsonl"},
        peft_config={"extends": "DEFAULT_LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
        training_config={"max_steps": 12, "learning_rate": 1e-2, "save_strategy": "no"},
    )
    first = run_config(write_config(folder, sft, "sft-no-dropout.yaml"))
    write_jsonl(folder / "prompts.jsonl", [{"prompt": f"Say {w}.", "solution": w} for w in ("red", "blue")] * 4)
    # (rewards that differ within a group: TRL computes the loss - and its KL term - only then)
    (folder / "vary.py").write_text(
        "def vary(completions, **_):\n    return [float(len(str(c)) % 3) for c in completions]\n"
    )
    first_kl = {}
    for reference_adapter in (True, False):
        config = tiny_config(
            project_name=f"grpo-{reference_adapter}",
            training_type="grpo",
            adapter_path=first["run_dir"],
            dataset={"path": "prompts.jsonl"},
            rewards=["./vary.py::vary"],
            training_config={"extends": "DEFAULT_GRPO", "use_vllm": False, "max_steps": 1, "beta": 0.1,
                             "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 32,
                             "save_strategy": "no", "reference_adapter": reference_adapter},
        )  # fmt: skip
        del config["training_config"]["max_length"]  # (GRPO keeps prompts whole)
        summary = run_config(write_config(folder, config, "grpo.yaml"))
        logs = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
        first_kl[reference_adapter] = next(r["kl"] for r in logs if "kl" in r)
    assert first_kl[True] < 1e-5 and first_kl[False] > 100 * first_kl[True], first_kl


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"peft_config": {"r": 16}}, "peft_config.r is 16 and the adapter at adapter_path has r 4"),
        ({"peft_config": {"use_peft": False}}, "use_peft: false"),
        ({"adapter_path": "./nowhere"}, "does not exist"),
        (
            {
                "training_type": "dpo",
                "training_config": {
                    "extends": "DEFAULT_DPO",
                    "reference_adapter": False,
                    "precompute_ref_log_probs": True,
                },
            },
            "reference_adapter: false with precompute_ref_log_probs",
        ),
    ],
)
def test_what_would_not_continue_the_adapter_is_refused(lora_run, extra, said):
    folder, first = lora_run
    config = tiny_config(**{"adapter_path": first["run_dir"], "dataset": {"path": "train.jsonl"}, **extra})
    result = invoke("validate", str(write_config(folder, config, "bad.yaml")))
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_an_adapter_of_another_base_is_refused_before_a_model_loads(lora_run, tmp_path):
    """The adapter's LoRA matrices (read from its file's header) must fit model_name's layers: a base of another
    architecture or size is said at validate, naming the layer and the adapter's base."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    from leap_finetune.api import validate_config
    from leap_finetune.errors import LeapError
    from leap_finetune.models.tiny import TINY_ARCH, load_tiny_tokenizer

    folder, first = lora_run
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    wider = tmp_path / "wider"  # the tiny architecture at twice the width
    Lfm2ForCausalLM(Lfm2Config(**{**TINY_ARCH, "hidden_size": 256}, vocab_size=len(tokenizer))).save_pretrained(wider)
    tokenizer.save_pretrained(wider)
    for model_name, said in ((str(wider), "has 128 inputs, that model's 256"), ("tiny-lfm2.5-vl", "is not a layer")):
        config = tiny_config(project_name="other", model_name=model_name, adapter_path=first["run_dir"])
        with pytest.raises(LeapError) as err:
            validate_config(write_config(folder, config, "other.yaml"))
        text = " ".join(err.value.format().split())
        assert f"does not fit model_name {model_name}" in text and said in text and "trained on" in text, text
