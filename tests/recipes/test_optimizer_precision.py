"""optimizer_precision (recipes/optimizers.py): bf16 weights with torch-optimi's Kahan-summation AdamW, through the
real trainer, and the config mistakes validate refuses."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import TrainerCallback

from leap_finetune.api import run_config
from leap_finetune.errors import LeapError
from leap_finetune.validate.loader import load_config
from tests.conftest import tiny_config, write_config


@pytest.fixture
def chat_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"count to {i % 7}"},
                {"role": "assistant", "content": "one two " * (i % 5 + 1)},
            ]
        }
        for i in range(32)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


class Weights(TrainerCallback):
    """The trained weights' dtype and the optimizer the trainer built, and how many weights moved."""

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.start = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_train_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        params = dict(model.named_parameters())
        self.dtypes = {p.dtype for p in params.values()}
        self.optimizer = type(getattr(optimizer, "optimizer", optimizer)).__module__
        moved = sum(int((params[n].detach() != self.start[n]).sum()) for n in self.start)
        self.moved = moved / sum(p.numel() for p in self.start.values())


def _train(folder, name, lr, steps=8, **training):
    weights = Weights()
    config = tiny_config(
        training_config={
            "max_steps": steps,
            "per_device_train_batch_size": 4,
            "logging_steps": 1,
            "learning_rate": lr,
            "save_strategy": "no",
            "warmup_steps": 0,
            **training,
        }
    )
    config["project_name"] = name
    summary = run_config(write_config(folder, config, f"{name}.yaml"), callbacks=[weights])
    losses = [m["loss"] for m in map(json.loads, open(f"{summary['run_dir']}/metrics.jsonl")) if "loss" in m]
    weights.log = open(f"{summary['run_dir']}/train.log").read()
    return weights, losses


def test_bf16_kahan_trains_bf16_weights_and_keeps_the_updates_bf16_drops(chat_data):
    kahan, losses = _train(chat_data, "kahan", 3e-3, steps=10, optimizer_precision="bf16_kahan")
    assert kahan.dtypes == {torch.bfloat16} and kahan.optimizer.startswith("optimi")
    assert losses[-1] < losses[0] * 0.8  # it learns
    # the run log says what trains (not "float32"): bf16 weights and the optimizer that keeps them exact
    assert "bf16 weights, torch-optimi AdamW with Kahan summation (optimizer_precision: bf16_kahan)" in kahan.log
    # lr 3e-6: each step's update is below bf16's resolution for almost every weight. Plain bf16 weights drop it;
    # the Kahan buffer carries it until it adds up to a representable change.
    plain, _ = _train(chat_data, "bf16", 3e-6, model_init_kwargs={"dtype": "bfloat16"})
    small, _ = _train(chat_data, "kahan-small", 3e-6, optimizer_precision="bf16_kahan")
    assert plain.optimizer.startswith("torch") and plain.dtypes == {torch.bfloat16}
    assert plain.moved < 0.05 and small.moved > 3 * plain.moved, (plain.moved, small.moved)


@pytest.mark.parametrize(
    ("training", "message", "fix"),
    [
        ({"optimizer_precision": "bf16"}, "optimizer_precision is 'bf16'", "bf16_kahan"),
        ({"optimizer_precision": "BF16_KAHAN"}, "optimizer_precision is 'BF16_KAHAN'", "did you mean 'bf16_kahan'?"),
        (
            {"optimizer_precision": "bf16_kahan", "model_init_kwargs": {"dtype": "float32"}},
            "dtype",
            "remove model_init_kwargs.dtype",
        ),
        ({"optimizer_precision": "bf16_kahan", "optim": "sgd"}, "optim is 'sgd'", "remove optim"),
        ({"optimizer_precision": "bf16_kahan", "model_init_kwargs": {"torch_dtype": "float32"}}, "'float32'", "dtype"),
        ({"optimizer_precision": "bf16_kahan", "model_init_kwargs": {"dtype": "auto"}}, "'auto'", "dtype"),
        ({"optimizer_precision": "bf16_kahan", "fp16": True}, "fp16 is true", "remove fp16"),
        ({"optimizer_precision": "fp32", "model_init_kwargs": {"dtype": "bfloat16"}}, "float32 master", "remove one"),
        ({"pad_to_multiple_of": 0}, "pad_to_multiple_of is 0", "whole number >= 1"),
        ({"optimizer_precision": "bf16_kahan", "peft_config": {"extends": "DEFAULT_LORA"}}, "LoRA", "dtype: bfloat16"),
    ],
)
def test_validate_refuses_contradicting_precision_keys(tmp_path, training, message, fix):
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
    )
    training = dict(training)
    peft = training.pop("peft_config", None)
    config = tiny_config(training_config=training)
    if peft:
        config["peft_config"] = peft
    with pytest.raises(LeapError) as err:
        load_config(write_config(tmp_path, config))
    assert message in str(err.value) and fix in err.value.fix


def test_a_missing_package_is_named_with_the_install_command(tmp_path, monkeypatch):
    from leap_finetune.config import precision

    monkeypatch.setitem(precision.PACKAGE, "bf16_kahan", ("optimi_not_installed_here", "torch-optimi"))
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
    )
    with pytest.raises(LeapError) as err:
        load_config(write_config(tmp_path, tiny_config(training_config={"optimizer_precision": "bf16_kahan"})))
    assert "torch-optimi" in str(err.value) and "pip install torch-optimi" in err.value.fix
