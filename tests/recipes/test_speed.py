"""The speed defaults (recipes/speed.py): what is chosen where, and that the fast path trains the
same tokens with the same losses as the plain path, through the real trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leap_finetune.api import run_config
from leap_finetune.recipes.speed import plan
from tests.conftest import tiny_config, write_config


def test_gpu_lfm2_gets_padding_free_and_compiled_layers():
    chosen = plan({}, "tiny-lfm2", cuda=True)
    assert chosen.padding_free and chosen.compile_layers
    assert "padding-free" in chosen.line and "torch.compile per decoder layer" in chosen.line


def test_gpu_sft_collates_in_data_loader_workers_unless_the_user_says_otherwise(tmp_path, monkeypatch):
    """On a GPU the batches are collated in 4 persistent worker processes (recipes/speed.py); a CPU run collates in
    the training process; the user's `dataloader_num_workers` wins, and 0 gets no persistent workers (torch refuses
    them)."""
    from leap_finetune.recipes import sft
    from leap_finetune.validate.loader import load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}) + "\n"
    )

    def arguments(training: dict, cuda: bool) -> dict:
        resolved = load_config(write_config(tmp_path, tiny_config(training_config=training)))
        return sft.training_arguments(resolved, run_dir=str(tmp_path / "run"), has_eval=False, cuda=cuda)

    gpu = arguments({}, cuda=True)
    assert gpu["dataloader_num_workers"] == 4 and gpu["dataloader_persistent_workers"] is True
    assert "dataloader_num_workers" not in arguments({}, cuda=False)
    mine = arguments({"dataloader_num_workers": 0}, cuda=True)
    assert mine["dataloader_num_workers"] == 0 and "dataloader_persistent_workers" not in mine
    two = arguments({"dataloader_num_workers": 2, "dataloader_persistent_workers": False}, cuda=True)
    assert two["dataloader_num_workers"] == 2 and two["dataloader_persistent_workers"] is False


def test_lora_with_activation_checkpointing_leaves_the_layers_uncompiled_and_says_why():
    """Measured on an H200 (torch 2.11): inductor fails on a checkpointed LoRA layer; the memory planner switches
    checkpointing on for LoRA on a small card, so this is the path it takes."""
    for key in ("activation_checkpointing", "gradient_checkpointing"):
        chosen = plan({key: True}, "tiny-lfm2", cuda=True, lora=True)
        assert chosen.padding_free and not chosen.compile_layers
        assert "compile_layers off: LoRA with activation checkpointing" in chosen.line
    assert plan({"activation_checkpointing": True}, "tiny-lfm2", cuda=True).compile_layers  # (a full fine-tune)
    assert plan({}, "tiny-lfm2", cuda=True, lora=True).compile_layers  # (LoRA without checkpointing)
    assert plan(
        {"activation_checkpointing": True, "compile_layers": True}, "tiny-lfm2", cuda=True, lora=True
    ).compile_layers


def test_cpu_and_unverified_models_keep_the_plain_path_and_say_why():
    cpu = plan({}, "tiny-lfm2", cuda=False)
    assert not cpu.padding_free and not cpu.compile_layers and "CPU" in cpu.line
    other = plan({}, "HuggingFaceTB/SmolLM2-135M", cuda=True)
    assert not other.padding_free and "verified for LFM2" in other.line


def test_the_users_keys_win():
    assert not plan({"padding_free": False, "compile_layers": False}, "tiny-lfm2", cuda=True).padding_free
    assert plan({"padding_free": True}, "tiny-lfm2", cuda=False).padding_free
    slow = plan({"padding_free": True, "compile_layers": True}, "tiny-lfm2", cuda=False)
    assert "on a CPU, compiling takes minutes" in slow.line and "compile_layers: false is faster" in slow.line
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


def test_flat_batches_are_padded_to_aligned_lengths_without_changing_what_is_trained(chat_data, monkeypatch):
    """pad_to_multiple_of (GEMM alignment): every flattened row's length is a multiple of 8, and the padding is
    its own documents with no loss - same losses and the same real tokens as unpadded rows."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    lengths = []
    original = DataCollatorForLanguageModeling.torch_call

    def recorded(self, examples):
        batch = original(self, examples)
        lengths.append((batch["input_ids"].shape[1], batch["cu_seq_lens_q"][-1].item()))
        return batch

    monkeypatch.setattr(DataCollatorForLanguageModeling, "torch_call", recorded)
    curves = {}
    for multiple in (1, None):  # None: leap-finetune's default for flat batches (8)
        training = {"max_steps": 6, "per_device_train_batch_size": 6, "logging_steps": 1, "learning_rate": 3e-3}
        training |= {"padding_free": True, "save_strategy": "no"}
        if multiple is not None:
            training["pad_to_multiple_of"] = multiple
        config = tiny_config(training_config=training)
        config["project_name"] = f"pad-{multiple}"
        lengths.clear()
        summary = run_config(write_config(chat_data, config, f"pad-{multiple}.yaml"))
        metrics = [json.loads(line) for line in open(f"{summary['run_dir']}/metrics.jsonl")]
        curves[multiple] = [(m["loss"], m["num_input_tokens_seen"]) for m in metrics if "loss" in m]
        if multiple is None:
            assert lengths and all(length % 8 == 0 and boundary == length for length, boundary in lengths)
        else:
            assert any(length % 8 for length, _ in lengths)  # the unpadded rows were not aligned already
    assert [t for _, t in curves[None]] == [t for _, t in curves[1]]  # padding is not counted as trained tokens
    assert [loss for loss, _ in curves[None]] == pytest.approx([loss for loss, _ in curves[1]], rel=2e-4)


def test_steps_between_logs_read_nothing_on_the_host_and_log_what_trl_logs(chat_data, monkeypatch):
    """recipes/host_syncs.py: no `.item()` / `if tensor` inside a step that does not log (each one makes the host
    wait for a GPU), and the logged loss, entropy, token accuracy and token counts equal TRL's own path's."""
    import torch
    from transformers import Trainer, TrainerCallback
    from trl import SFTTrainer

    from leap_finetune.recipes.host_syncs import DeviceSideMetrics

    class CountReads(TrainerCallback):
        def __init__(self):
            self.inside, self.reads, self.outside = False, {}, 0

        def on_step_begin(self, args, state, control, **kwargs):
            self.inside = True
            self.reads[state.global_step + 1] = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.inside = False

    counter = CountReads()
    item, as_bool = torch.Tensor.item, torch.Tensor.__bool__

    def counted(original):
        def read(tensor):
            if counter.inside:
                counter.reads[max(counter.reads)] += 1
            elif counter.reads:
                counter.outside += 1
            return original(tensor)

        return read

    def run(name, callbacks=None):
        # evaluation and checkpoints between the logging steps, and two micro-batches per step: every point where
        # the pending sums must be read before TRL or the Trainer use them
        training = {"max_steps": 8, "per_device_train_batch_size": 3, "logging_steps": 4, "learning_rate": 3e-3}
        training |= {"padding_free": True, "logging_nan_inf_filter": False, "gradient_accumulation_steps": 2}
        training |= {"eval_steps": 3, "save_strategy": "steps", "save_steps": 3}
        config = tiny_config(training_config=training)
        config["dataset"]["test_size"] = 6
        config["project_name"] = name
        summary = run_config(write_config(chat_data, config, f"{name}.yaml"), callbacks=callbacks)
        records = [json.loads(line) for line in open(f"{summary['run_dir']}/metrics.jsonl")]
        state = json.loads(next(Path(summary["run_dir"]).glob("checkpoint-3/trainer_state.json")).read_text())
        return records, state["num_input_tokens_seen"]

    monkeypatch.setattr(torch.Tensor, "item", counted(item))
    monkeypatch.setattr(torch.Tensor, "__bool__", counted(as_bool))
    ours, ours_saved = run("device-metrics", callbacks=[counter])
    monkeypatch.undo()
    assert len(counter.reads) == 8 and not any(counter.reads.values())
    assert counter.outside > 0  # the sums are read when logging, after the step (the counter does see reads)

    monkeypatch.setattr(DeviceSideMetrics, "compute_loss", SFTTrainer.compute_loss)
    monkeypatch.setattr(DeviceSideMetrics, "_track_num_input_tokens", Trainer._track_num_input_tokens)
    trl, trl_saved = run("trl-metrics")
    keys = ("loss", "entropy", "mean_token_accuracy", "num_tokens", "num_input_tokens_seen")
    train = [[r for r in records if "loss" in r] for records in (ours, trl)]
    assert len(train[0]) == len(train[1]) == 2
    for mine, theirs in zip(*train, strict=True):
        assert {k: mine[k] for k in keys} == pytest.approx({k: theirs[k] for k in keys}, rel=1e-5)
    assert train[0][1]["mean_token_accuracy"] != train[0][0]["mean_token_accuracy"]  # real per-interval values
    evals = [[r for r in records if "eval_loss" in r] for records in (ours, trl)]
    assert len(evals[0]) == len(evals[1]) >= 2  # the baseline, step 3, step 6 (between logging steps)
    for mine, theirs in zip(*evals, strict=True):
        assert mine["eval_num_tokens"] == theirs["eval_num_tokens"] and mine["step"] == theirs["step"]
    assert ours_saved == trl_saved > 0  # the checkpoint at step 3 (before any log) holds the tokens seen
