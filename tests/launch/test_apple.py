"""Apple Silicon (faked: no Mac here, docs/install.md says so): without CUDA, on an arm64 Mac with PyTorch's MPS
backend, training runs on the Mac's GPU - the Trainer's `use_cpu: false` - in bf16 where that GPU has it, float32
otherwise; `plan` and `run` say so in their devices line; `use_cpu: true` keeps the CPU."""

from __future__ import annotations

import pytest

from leap_finetune.models import apple
from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl


@pytest.fixture
def a_mac(monkeypatch):
    """An arm64 Mac whose PyTorch has MPS (the answers its three questions give there)."""
    monkeypatch.setattr(apple, "on_apple_silicon", lambda: True)
    monkeypatch.setattr(apple, "mps_available", lambda: True)
    monkeypatch.setattr(apple, "mps_bf16", lambda: True)
    return monkeypatch


def _config(workdir, **training):
    write_jsonl(workdir / "train.jsonl", fact_rows(24))
    return write_config(workdir, tiny_config(training_config=training))


@pytest.mark.parametrize("bf16", [True, False])
def test_the_training_process_picks_the_macs_gpu_in_bf16_where_it_has_it(workdir, a_mac, bf16):
    from leap_finetune.recipes.common import common_arguments
    from leap_finetune.validate.loader import load_config

    a_mac.setattr(apple, "mps_bf16", lambda: bf16)
    args = common_arguments(load_config(_config(workdir)), run_dir=str(workdir), has_eval=False)
    assert args["use_cpu"] is False and args["bf16"] is bf16  # (the Trainer then places the model on mps)
    kept = common_arguments(load_config(_config(workdir, use_cpu=True)), run_dir=str(workdir), has_eval=False)
    assert kept["use_cpu"] is True and kept["bf16"] is False


def test_plan_says_the_macs_gpu_and_a_pc_without_cuda_says_cpu(workdir, monkeypatch):
    import transformers.training_args

    config = _config(workdir)
    monkeypatch.setattr(apple, "on_apple_silicon", lambda: True)
    # (transformers asks torch whether the GPU - mps on a Mac - has bf16: yes there, no here)
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    mac = invoke("plan", str(config), cwd=workdir)
    assert mac.returncode == 0, mac.stderr
    out = " ".join((mac.stdout + mac.stderr).split())
    assert "devices: Apple GPU (mps)" in out and "bf16 mixed precision" in out
    monkeypatch.setattr(apple, "on_apple_silicon", lambda: False)
    monkeypatch.undo()  # (this machine's own answers)
    pc = invoke("plan", str(config), cwd=workdir)
    assert "devices: CPU only" in pc.stdout + pc.stderr and "float32" in pc.stdout + pc.stderr


def test_mps_is_asked_of_torch_and_bf16_of_the_device():
    """Here (Linux, no MPS) the real answers are no; on a Mac they come from torch.backends.mps."""
    assert apple.on_apple_silicon() is False and apple.mps_available() is False
    assert apple.mps_bf16() is False  # (no mps device: the bf16 tensor cannot be made)
