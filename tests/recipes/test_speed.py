"""The speed defaults (recipes/speed.py): what is chosen where, and that the fast path trains the
same tokens with the same losses as the plain path, through the real trainer."""

from __future__ import annotations

import json

import pytest

from leap_finetune.api import run_config
from leap_finetune.recipes.speed import plan
from tests.conftest import tiny_config, write_config


def test_gpu_lfm2_gets_padding_free_and_compiled_layers():
    chosen = plan({}, "tiny-lfm2", cuda=True)
    assert chosen.padding_free and chosen.compile_layers
    assert "padding-free" in chosen.line and "torch.compile per decoder layer" in chosen.line


def test_cpu_and_unverified_models_keep_the_plain_path_and_say_why():
    cpu = plan({}, "tiny-lfm2", cuda=False)
    assert not cpu.padding_free and not cpu.compile_layers and "CPU" in cpu.line
    other = plan({}, "HuggingFaceTB/SmolLM2-135M", cuda=True)
    assert not other.padding_free and "verified for LFM2" in other.line


def test_the_users_keys_win():
    assert not plan({"padding_free": False, "compile_layers": False}, "tiny-lfm2", cuda=True).padding_free
    assert plan({"padding_free": True}, "tiny-lfm2", cuda=False).padding_free
    packing = plan({"packing": True}, "tiny-lfm2", cuda=True)
    assert not packing.padding_free and packing.line.startswith("speed: packing")


@pytest.fixture
def chat_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import random

    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    rows = []
    for _i in range(48):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(2, 30)))
        answer = " ".join(rng.choice(words) for _ in range(rng.randint(1, 40)))
        rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_padding_free_losses_equal_padded_losses_step_by_step(chat_data):
    """The fast path's batching (padding-free, varlen attention, boundary-aware convolution) against
    padded batches: same conversations per step, so the same loss at every step."""
    curves = {}
    for padding_free in (False, True):
        config = tiny_config(
            training_config={
                "max_steps": 12,
                "per_device_train_batch_size": 6,
                "logging_steps": 1,
                "learning_rate": 3e-3,
                "padding_free": padding_free,
                "save_strategy": "no",
            }
        )
        config["project_name"] = f"pf-{padding_free}"
        summary = run_config(write_config(chat_data, config, f"pf-{padding_free}.yaml"))
        metrics = [json.loads(line) for line in open(f"{summary['run_dir']}/metrics.jsonl")]
        curves[padding_free] = [m["loss"] for m in metrics if "loss" in m]
        tokens = [m["num_input_tokens_seen"] for m in metrics if "num_input_tokens_seen" in m]
        curves[f"tokens-{padding_free}"] = tokens
    assert len(curves[True]) == 12
    assert curves[True] == pytest.approx(curves[False], rel=2e-4)
    assert curves[True][-1] < curves[True][0] * 0.8  # and it learns
    assert curves["tokens-True"] == curves["tokens-False"]  # the same real tokens were trained on


def test_whole_model_torch_compile_is_refused_with_the_alternative(tmp_path):
    from leap_finetune.errors import LeapError
    from leap_finetune.validate.loader import load_config

    (tmp_path / "train.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}) + "\n"
    )
    config = tiny_config(training_config={"torch_compile": True})
    with pytest.raises(LeapError) as err:
        load_config(write_config(tmp_path, config))
    assert "loss of 0" in str(err.value) and "compile_layers: true" in err.value.fix
    bad = tiny_config(training_config={"compile_layers": "yes"})
    with pytest.raises(LeapError, match="compile_layers"):
        load_config(write_config(tmp_path, bad))


@pytest.mark.slow
def test_compiled_layers_train_with_the_losses_of_eager_layers(chat_data):
    """compile_layers (torch.compile per decoder layer, the GPU default) on the CPU backend: the
    layers really are compiled, and the padding-free losses are those of the eager layers."""
    import torch._dynamo

    curves = {}
    for compile_layers in (False, True):
        before = sum(torch._dynamo.utils.counters["stats"].values())
        config = tiny_config(
            training_config={
                "max_steps": 3,
                "per_device_train_batch_size": 6,
                "logging_steps": 1,
                "learning_rate": 3e-3,
                "padding_free": True,
                "compile_layers": compile_layers,
                "save_strategy": "no",
            }
        )
        config["project_name"] = f"compiled-{compile_layers}"
        summary = run_config(write_config(chat_data, config, f"compiled-{compile_layers}.yaml"))
        curves[compile_layers] = [
            m["loss"] for m in map(json.loads, open(f"{summary['run_dir']}/metrics.jsonl")) if "loss" in m
        ]
        compiled = sum(torch._dynamo.utils.counters["stats"].values()) - before
        assert (compiled > 0) == compile_layers
    assert len(curves[True]) == 3
    assert curves[True] == pytest.approx(curves[False], rel=1e-5)
