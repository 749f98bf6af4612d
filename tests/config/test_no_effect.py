"""Settings that would do nothing in the run are said (validate, plan and run print a note naming the key, why,
and what would make it count); the profiles' own defaults are never named, only what the user wrote."""

from __future__ import annotations

import pytest

from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl


def _grpo(**overrides) -> dict:
    return {
        "project_name": "g",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": ["accuracy"],
        "training_config": {"use_vllm": False},
        **overrides,
    }


CASES = {
    "eval_keys_without_eval_rows": (
        tiny_config(training_config={"eval_strategy": "steps", "eval_steps": 5}),
        "training_config.eval_steps, training_config.eval_strategy: no effect: the run has no evaluation rows",
    ),
    "reserved_block_in_sync_mode": (
        tiny_config(async_eval={"mode": "sync", "reserved": {"server_port": 9000}}),
        "async_eval.reserved has no effect: async_eval.mode is sync (it acts in mode reserved)",
    ),
    "sbatch_block_in_reserved_mode": (
        tiny_config(
            async_eval={"mode": "reserved", "vllm_gpus": 0, "sbatch": {"time": "00:10:00"}},
            evals={"benchmarks": [{"name": "b", "path": "train.jsonl", "metric": "exact_match"}]},
        ),
        "async_eval.sbatch has no effect: async_eval.mode is reserved (it acts in mode sidecar)",
    ),
    "test_size_beside_val_path": (
        tiny_config(dataset={"path": "train.jsonl", "val_path": "held.jsonl", "test_size": 2}),
        "dataset.test_size has no effect: dataset.val_path is the evaluation data",
    ),
    "lora_keys_with_use_peft_false": (
        tiny_config(peft_config={"use_peft": False, "r": 64}),
        "peft_config.r: no effect with use_peft: false",
    ),
    "warmup_under_a_constant_schedule": (
        tiny_config(training_config={"lr_scheduler_type": "constant", "warmup_steps": 10}),
        "training_config.warmup_steps has no effect with lr_scheduler_type: constant",
    ),
    "save_keys_with_save_strategy_no": (
        tiny_config(training_config={"save_strategy": "no", "save_total_limit": 2}),
        "training_config.save_steps, training_config.save_total_limit: no effect with save_strategy: no",
    ),
    "server_keys_without_a_server": (
        _grpo(grpo_rollout={"gpu_memory_utilization": 0.5}),
        "grpo_rollout.gpu_memory_utilization: no effect without a local server",
    ),
    "sampling_keys_without_do_sample": (
        tiny_config(
            evals={
                "temperature": 0.7,
                "top_p": 0.9,
                "benchmarks": [{"name": "b", "path": "train.jsonl", "metric": "exact_match"}],
            }
        ),
        "evals.temperature, evals.top_p: no effect with evals.do_sample: false (benchmarks decode greedily, the "
        "default); set evals.do_sample: true",
    ),
    "checkpointing_kwargs_without_checkpointing": (
        tiny_config(training_config={"gradient_checkpointing_kwargs": {"use_reentrant": False}}),
        "training_config.gradient_checkpointing_kwargs has no effect with activation checkpointing off",
    ),
    "vision_encoder_rate_with_the_encoder_frozen": (
        tiny_config(
            model_name="tiny-lfm2.5-vl",
            peft_config={"use_peft": True, "r": 4},
            training_config={"vision_encoder_lr_multiplier": 0.5},
        ),
        "training_config.vision_encoder_lr_multiplier has no effect: the vision encoder is frozen "
        "(train_vision_encoder: false, LoRA's default",
    ),
    "vllm_keys_with_use_vllm_false": (
        _grpo(training_config={"use_vllm": False, "vllm_gpu_memory_utilization": 0.2}),
        "training_config.vllm_gpu_memory_utilization: no effect with use_vllm: false",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_a_setting_with_no_effect_is_named_by_validate_and_plan(workdir, name):
    config, expected = CASES[name]
    write_jsonl(workdir / "train.jsonl", fact_rows(12))
    write_jsonl(workdir / "held.jsonl", fact_rows(3))
    write_jsonl(workdir / "prompts.jsonl", [{"prompt": f"Name color {i}.", "solution": "teal"} for i in range(16)])
    path = write_config(workdir, config)
    checked = invoke("validate", str(path), cwd=workdir)
    assert checked.returncode == 0, checked.stderr
    assert f"note: {expected}" in " ".join(checked.stderr.split()), checked.stderr
    planned = invoke("plan", str(path), cwd=workdir)
    assert expected in " ".join((planned.stdout + planned.stderr).split())


def test_the_profiles_own_defaults_and_settings_that_act_are_not_named(workdir):
    """DEFAULT_SFT sets eval_steps and save_steps; a config with an eval split and the keys in their modes says
    nothing."""
    write_jsonl(workdir / "train.jsonl", fact_rows(12))
    quiet = [
        tiny_config(),
        tiny_config(dataset={"path": "train.jsonl", "test_size": 2}, training_config={"eval_steps": 2}),
        tiny_config(training_config={"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 2}),
        tiny_config(peft_config={"use_peft": True, "r": 4}),
        tiny_config(model_name="tiny-lfm2.5-vl", training_config={"vision_encoder_lr_multiplier": 0.5}),
        tiny_config(
            evals={
                "do_sample": True,
                "temperature": 0.7,
                "benchmarks": [{"name": "b", "path": "train.jsonl", "metric": "exact_match"}],
            }
        ),
    ]
    # (an external vLLM server's start timeout is TRL's wait for it: it acts; vLLM need not be installed to load)
    from leap_finetune.validate.loader import load_config

    external = _grpo(grpo_rollout={"server_start_timeout_s": 60})
    external["training_config"] = {"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://h:8000"}
    write_jsonl(workdir / "prompts.jsonl", [{"prompt": f"Name color {i}.", "solution": "teal"} for i in range(16)])
    assert load_config(write_config(workdir, external, "external.yaml")).config_notes == []
    for index, config in enumerate(quiet):
        result = invoke("validate", str(write_config(workdir, config, f"c{index}.yaml")), cwd=workdir)
        assert result.returncode == 0 and "no effect" not in result.stderr, (index, result.stderr)


def test_evaluation_data_that_gives_no_rows_is_said_not_evaluated_over_nothing(workdir):
    """val_path whose every row is invalid and skipped: the run would log no eval loss without a word."""
    write_jsonl(workdir / "train.jsonl", fact_rows(12))
    write_jsonl(workdir / "held.jsonl", [{"messages": [{"role": "user", "content": "no answer"}]}] * 3)
    config = tiny_config(dataset={"path": "train.jsonl", "val_path": "held.jsonl", "on_invalid": "skip"})
    checked = invoke("validate", str(write_config(workdir, config)), cwd=workdir)
    said = " ".join(checked.stderr.split())
    assert checked.returncode == 0, checked.stderr
    asked = f"({workdir / 'train.jsonl'}: val_path {workdir / 'held.jsonl'})"
    assert f"note: no evaluation rows: the evaluation data asked for {asked} gave none" in said
    assert "so no eval loss is computed" in said
