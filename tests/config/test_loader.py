"""The config contract: keys, profiles, types, paths, names."""

from __future__ import annotations

from pathlib import Path

import pytest

from leap_finetune.config.profiles import TRAINING_PROFILES
from leap_finetune.errors import LeapError
from leap_finetune.validate.loader import load_config
from tests.conftest import fact_rows, tiny_config, write_config, write_jsonl


@pytest.fixture
def folder(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", fact_rows(8))
    return tmp_path


def _error(folder: Path, config: dict) -> str:
    with pytest.raises(LeapError) as info:
        load_config(write_config(folder, config))
    return info.value.format()


@pytest.mark.parametrize(
    ("block", "bad_key", "suggestion"),
    [
        (None, "model_nme", "model_name"),
        ("dataset", "test_sise", "test_size"),
        ("training_config", "learnig_rate", "learning_rate"),
        ("peft_config", "lora_alpah", "lora_alpha"),
    ],
)
def test_unknown_keys_are_errors_with_a_suggestion(folder, block, bad_key, suggestion):
    config = tiny_config()
    if block is None:
        config[bad_key] = "x"
    else:
        config.setdefault(block, {})[bad_key] = 1
    message = _error(folder, config)
    assert f"unknown key '{bad_key}'" in message
    assert f"did you mean '{suggestion}'" in message


def test_profile_is_inherited_and_user_keys_override(folder):
    resolved = load_config(write_config(folder, tiny_config(training_config={"learning_rate": 5e-4})))
    assert resolved.training["learning_rate"] == 5e-4
    # untouched keys come from DEFAULT_SFT
    assert resolved.training["lr_scheduler_type"] == TRAINING_PROFILES["DEFAULT_SFT"]["lr_scheduler_type"]
    assert resolved.loss_on == "assistant"


def test_without_extends_the_training_types_default_profile_applies(folder):
    config = tiny_config()
    config["training_config"] = {"max_steps": 2}
    resolved = load_config(write_config(folder, config))
    assert resolved.training["max_length"] == TRAINING_PROFILES["DEFAULT_SFT"]["max_length"]
    assert resolved.training["max_steps"] == 2


def test_unknown_profile_is_an_error(folder):
    assert "did you mean 'DEFAULT_SFT'" in _error(folder, tiny_config(training_config={"extends": "DEFAULT_SFTT"}))


def test_a_profile_in_the_other_block_says_where_it_belongs(folder):
    message = _error(folder, tiny_config(training_config={"extends": "DEFAULT_QLORA"}))
    assert "DEFAULT_QLORA is a profile of peft_config" in message and "peft_config: {extends: DEFAULT_QLORA}" in message
    message = _error(folder, {**tiny_config(), "peft_config": {"extends": "DEFAULT_SFT"}})
    assert "DEFAULT_SFT is a profile of training_config" in message and "DEFAULT_LORA" in message


def test_scientific_notation_without_a_dot_is_a_float(folder):
    path = folder / "c.yaml"
    path.write_text(
        "model_name: tiny-lfm2\ndataset:\n  path: train.jsonl\ntraining_config:\n  learning_rate: 2e-5\n  weight_decay: 1E-2\n"
    )
    resolved = load_config(path)
    assert resolved.training["learning_rate"] == pytest.approx(2e-5)
    assert isinstance(resolved.training["weight_decay"], float)


def test_relative_paths_resolve_against_the_config_folder(folder, tmp_path, monkeypatch):
    (folder / "sub").mkdir()
    monkeypatch.chdir("/")
    config = tiny_config(data="../train.jsonl", output_dir="../out")
    resolved = load_config(write_config(folder / "sub", config))
    assert resolved.dataset.path == str((folder / "train.jsonl").resolve())
    assert resolved.output_dir == str((folder / "out").resolve())


def test_hub_dataset_ids_are_kept(folder):
    resolved = load_config(write_config(folder, tiny_config(data="HuggingFaceTB/smoltalk")))
    assert resolved.dataset.path == "HuggingFaceTB/smoltalk"


def test_embedding_takes_its_lengths_per_side(folder):
    config = tiny_config(training_type="embedding")
    config["training_config"].pop("extends")
    message = _error(folder, config)  # tiny_config has max_length
    assert "retrieval.query_max_length and retrieval.document_max_length" in message


def test_unknown_training_type_suggests(folder):
    assert "did you mean 'sft'" in _error(folder, tiny_config(training_type="sfft"))


def test_a_misspelled_choice_of_a_block_suggests_the_right_one(folder):
    config = tiny_config(
        evals={"benchmarks": [{"name": "c", "path": "bench.jsonl", "metric": "exact_match"}]},
        async_eval={"mode": "reserved", "vllm_gpus": 0, "reserved": {"weight_reload": "inplace"}},
    )
    message = _error(folder, config)
    assert "async_eval.reserved.weight_reload" in message and "(got 'inplace')" in message
    assert "did you mean 'in_place'?" in message


def test_keys_the_trainer_would_ignore_are_rejected(folder):
    message = _error(folder, tiny_config(training_config={"completion_only_loss": True}))
    assert "decided by leap-finetune" in message and "loss_on" in message


def test_assistant_only_loss_maps_to_loss_on(folder):
    resolved = load_config(write_config(folder, tiny_config(training_config={"assistant_only_loss": False})))
    assert resolved.loss_on == "all"
    assert "assistant_only_loss" not in resolved.training


def test_bad_loss_on_value(folder):
    assert "expected one of: assistant, all, final_assistant" in _error(
        folder, tiny_config(training_config={"loss_on": "asistant"})
    )


def test_duplicate_keys_are_errors(folder):
    path = folder / "c.yaml"
    path.write_text("model_name: tiny-lfm2\nmodel_name: tiny-lfm2.5\ndataset: {path: train.jsonl}\n")
    with pytest.raises(LeapError, match="duplicate key 'model_name'"):
        load_config(path)


def test_bad_yaml_names_line_and_column(folder):
    path = folder / "c.yaml"
    path.write_text("model_name: tiny-lfm2\ndataset: {path: [train.jsonl}\n")
    with pytest.raises(LeapError) as info:
        load_config(path)
    assert f"{path}:2:" in info.value.format()


def test_missing_required_key(folder):
    config = tiny_config()
    del config["model_name"]
    assert "required key 'model_name' is missing" in _error(folder, config)


def test_wrong_type_is_reported_with_the_key(folder):
    message = _error(folder, tiny_config(dataset={"path": "train.jsonl", "limit": "many"}))
    assert "dataset.limit" in message


def test_peft_profile_and_use_peft(folder):
    resolved = load_config(write_config(folder, tiny_config(peft_config={"extends": "DEFAULT_LORA", "r": 4})))
    assert resolved.peft["r"] == 4
    assert set(resolved.peft["target_modules"]) >= {"q_proj", "in_proj", "w1"}
    off = load_config(write_config(folder, tiny_config(peft_config={"extends": "DEFAULT_LORA", "use_peft": False})))
    assert off.peft is None


@pytest.mark.parametrize(
    ("name", "model_id", "family", "template"),
    [
        ("LFM2-1.2B", "LiquidAI/LFM2-1.2B", "lfm2", "lfm2"),
        ("LFM2.5-1.2B-Instruct", "LiquidAI/LFM2.5-1.2B-Instruct", "lfm2.5", "lfm2.5"),
        ("LiquidAI/LFM2-350M", "LiquidAI/LFM2-350M", "lfm2", "lfm2"),
        ("tiny-lfm2", "tiny-lfm2", "lfm2", "lfm2"),
        ("tiny-lfm2.5", "tiny-lfm2.5", "lfm2.5", "lfm2.5"),
        ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", "other", "model"),
    ],
)
def test_model_names_and_families(folder, name, model_id, family, template):
    resolved = load_config(write_config(folder, tiny_config(model_name=name)))
    assert (resolved.model_id, resolved.model_family, resolved.chat_template) == (model_id, family, template)


def test_a_model_name_that_is_a_file_says_so(folder):
    """Its tokenizer's loading error advised `hf download` of the file's path."""
    message = _error(folder, tiny_config(model_name="./train.jsonl"))
    assert "./train.jsonl is a file" in message and "not a model" in message and "hf download" not in message
    assert "a model folder (config.json, weights and tokenizer)" in message


def test_chat_template_override_by_name_and_file(folder):
    resolved = load_config(write_config(folder, tiny_config(chat_template="lfm2.5")))
    assert resolved.chat_template == "lfm2.5"
    (folder / "mine.jinja").write_text("{{ messages }}")
    resolved = load_config(write_config(folder, tiny_config(chat_template="mine.jinja")))
    assert resolved.chat_template == str(folder / "mine.jinja")
    assert "did you mean 'lfm2.5'" in _error(folder, tiny_config(chat_template="lfm2.6"))


def test_dataset_type_must_match_training_type(folder):
    assert "dataset.type" in _error(folder, tiny_config(dataset={"path": "train.jsonl", "type": "dpo"}))


def test_fractional_test_size_above_one_is_an_error(folder):
    assert "whole number" in _error(folder, tiny_config(dataset={"path": "train.jsonl", "test_size": 2.5}))


def test_python_api_accepts_a_dict(folder, monkeypatch):
    monkeypatch.chdir(folder)
    resolved = load_config(tiny_config())
    assert resolved.dataset.path == str(folder / "train.jsonl")


def _evals(*benchmarks) -> dict:
    return {"benchmarks": list(benchmarks)}


def test_evals_block_paths_and_metrics(folder):
    (folder / "bench.jsonl").write_text("")
    (folder / "my_metrics.py").write_text("def score(p, r, row):\n    return 1.0\n")
    resolved = load_config(
        write_config(
            folder,
            tiny_config(
                evals=_evals(
                    {"name": "a", "path": "bench.jsonl", "metric": "exact_match"},
                    {"name": "b", "path": "bench.jsonl", "metric": "./my_metrics.py::score"},
                    {"name": "c", "path": "bench.jsonl", "metric": "logprob_zero_shot"},
                )
            ),
        )
    )
    assert resolved.evals.benchmarks[0].path == str(folder / "bench.jsonl")
    assert resolved.evals.benchmarks[1].metric == f"{folder / 'my_metrics.py'}::score"


@pytest.mark.parametrize(
    ("benchmark", "message"),
    [
        ({"name": "a", "path": "b.jsonl", "metric": "exact_mach"}, "did you mean 'exact_match'"),
        ({"name": "a", "path": "b.jsonl", "metric": "./missing.py::f"}, "file not found"),
        ({"name": "a", "path": "b.jsonl", "metric": "bleu", "limt": 3}, "did you mean 'limit'"),
    ],
)
def test_evals_mistakes(folder, benchmark, message):
    assert message in _error(folder, tiny_config(evals=_evals(benchmark)))


def test_duplicate_benchmark_names(folder):
    bench = {"name": "a", "path": "b.jsonl", "metric": "bleu"}
    assert "two benchmarks are named 'a'" in _error(folder, tiny_config(evals=_evals(bench, bench)))


def test_training_without_a_dataset_is_a_clear_error(folder):
    from leap_finetune.api import validate_config

    config = tiny_config()
    del config["dataset"]
    with pytest.raises(LeapError, match="required key 'dataset' is missing"):
        validate_config(write_config(folder, config))


def test_the_specs_async_eval_block_parses_in_every_mode_and_its_mistakes_are_errors(folder, monkeypatch):
    from leap_finetune.api import validate_config

    write_jsonl(folder / "train.jsonl", fact_rows(16))
    (folder / "bench.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}\n'
    )
    evals = {"benchmarks": [{"name": "hi", "path": "bench.jsonl", "metric": "exact_match"}]}
    block = {
        "mode": "sidecar",
        "vllm_gpus": 1,
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "sbatch": {"time": "00:30:00", "partition": "gpu", "account": "team", "extra_args": ["--qos=eval"]},
        "reserved": {"weight_reload": "respawn", "server_port": 8100},
        "failure": {"max_consecutive": 2},
        "on_overlap": "skip",
    }
    for mode in ("sync", "sidecar", "reserved"):
        resolved = load_config(write_config(folder, tiny_config(evals=evals, async_eval={**block, "mode": mode})))
        assert resolved.async_eval.mode == mode and resolved.async_eval.sbatch.extra_args == ["--qos=eval"]
    sidecar = {**block, "vllm_gpus": 0}
    assert "has no benchmarks (no evals: block" in _error(folder, tiny_config(async_eval=sidecar))
    multi_node = _error(
        folder, tiny_config(evals=evals, async_eval={**sidecar, "mode": "reserved"}, slurm={"nodes": 2})
    )
    assert "slurm.nodes is 2" in multi_node and "use mode: sidecar" in multi_node
    assert "sbatch.time" in _error(folder, tiny_config(evals=evals, async_eval={**sidecar, "sbatch": {"time": "soon"}}))
    assert "did you mean 'partition'" in _error(
        folder, tiny_config(evals=evals, async_eval={**sidecar, "sbatch": {"partiton": "gpu"}})
    )
    assert "on_overlap" in _error(folder, tiny_config(evals=evals, async_eval={**sidecar, "on_overlap": "later"}))
    assert "vllm_gpus" in _error(folder, tiny_config(evals=evals, async_eval={**sidecar, "vllm_gpus": -1}))
    assert "did you mean 'vllm_gpus'" in _error(folder, tiny_config(async_eval={"vllm_gpu": 1}))
    # what only the machine can say, at validate: reserved GPUs on a CPU machine, sbatch not installed
    reserved_gpu = write_config(folder, tiny_config(evals=evals, async_eval={**block, "mode": "reserved"}))
    with pytest.raises(LeapError, match="no GPU is visible"):
        validate_config(reserved_gpu)
    monkeypatch.setenv("PATH", str(folder))
    with pytest.raises(LeapError, match="submits each evaluation with sbatch, which is not installed here"):
        validate_config(write_config(folder, tiny_config(evals=evals, async_eval=sidecar)))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"training_config": {"resume_allow_changes": 5}}, "training_config.resume_allow_changes is 5"),
        (
            {"training_config": {"resume_allow_changes": ["learning_rate", "seed"]}},
            "resume_allow_changes lists seed, which a resume cannot change",
        ),
        ({"training_config": {"resume_allow_changes": ["dataset"]}}, "a resume never changes the data"),
        ({"training_config": {"resume_allow_changes": ["all", "learning_rate"]}}, "lists `all` with other keys"),
        ({"training_config": {"resume_allow_changes": ["learnig_rate"]}}, "did you mean 'learning_rate'"),
        (
            {"slurm": {"time": "01:00:00", "stop_before_time_limit_s": 3600}},
            "stop_before_time_limit_s (3600 s) is not shorter than the job's time limit (01:00:00 = 3600 s)",
        ),
        ({"slurm": {"stop_before_time_limit_s": 99999}}, "stop_before_time_limit_s"),
    ],
)
def test_fault_keys_are_checked(folder, change, expected):
    """The keys of resumes and of stopping before a SLURM time limit: wrong values are errors that say why."""
    config = tiny_config()
    for block, values in change.items():
        config[block] = {**config.get(block, {}), **values} if isinstance(config.get(block), dict) else values
    assert expected in " ".join(_error(folder, config).split())


def test_a_judge_url_needs_its_scheme(folder):
    write_jsonl(folder / "prompts.jsonl", [{"prompt": "Name a color.", "solution": "teal"}])
    config = {
        "project_name": "g",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": {"judge": {"model": "m", "base_url": "127.0.0.1:8000/v1"}},
        "training_config": {"use_vllm": False},
    }
    text = " ".join(_error(folder, config).split())
    assert "rewards.judge.base_url is '127.0.0.1:8000/v1': expected an http:// or https:// URL" in text
    assert "http://127.0.0.1:8000/v1" in text


def test_a_dataset_given_as_a_path_is_the_mapping_it_stands_for(folder):
    """`dataset: train.jsonl` (a newcomer's first guess) is `dataset: {path: train.jsonl}`; in a list too."""
    resolved = load_config(write_config(folder, {**tiny_config(), "dataset": "train.jsonl"}))
    assert resolved.dataset.path == str(folder / "train.jsonl")
    write_jsonl(folder / "more.jsonl", fact_rows(4))
    mixed = load_config(write_config(folder, {**tiny_config(), "dataset": ["train.jsonl", {"path": "more.jsonl"}]}))
    assert [d.path for d in mixed.dataset] == [str(folder / "train.jsonl"), str(folder / "more.jsonl")]
    assert "dataset is 5: expected a path, a mapping with a path" in _error(folder, {**tiny_config(), "dataset": 5})


@pytest.mark.parametrize(
    ("key", "value", "block"),
    [("learning_rate", 1e-4, "training_config"), ("loss_on", "all", "training_config"), ("r", 8, "peft_config")],
)
def test_a_training_or_lora_key_at_the_top_level_is_told_where_it_belongs(folder, key, value, block):
    message = _error(folder, {**tiny_config(), key: value})
    assert f"'{key}' is a" in message and f"move it under {block}:" in message
    assert "training_type" not in message.split("fix:")[-1]  # (was: "did you mean 'training_type'?")


def test_pydantic_words_do_not_reach_the_user(folder):
    test_size = _error(folder, tiny_config(dataset={"path": "train.jsonl", "test_size": 1.5}))
    assert "Value error" not in test_size and "a test_size >= 1 is a row count" in test_size
    not_a_mapping = _error(folder, {**tiny_config(), "training_config": 5})
    assert "give training_config a mapping of its keys" in not_a_mapping


def test_run_refuses_checkpoint_which_only_eval_reads(folder):
    """A config with `checkpoint:` trained from model_name with exit 0, the checkpoint silently ignored."""
    from leap_finetune.api import validate_config

    with pytest.raises(LeapError) as info:
        validate_config(write_config(folder, {**tiny_config(), "checkpoint": str(folder)}))
    message = info.value.format()
    assert "checkpoint: names the model `leap-finetune eval` scores" in message
    assert "resume_from_checkpoint" in message and "model_name" in message


def test_gradient_communication_written_as_its_default_is_the_default(folder):
    """`gradient_communication: fp32` is the default spelled out: dropped from the resolved config, so a resume that
    adds or removes it is not refused as a change; bf16 is kept."""
    fp32 = load_config(write_config(folder, tiny_config(training_config={"gradient_communication": "fp32"})))
    assert "gradient_communication" not in fp32.training
    bf16 = load_config(write_config(folder, tiny_config(training_config={"gradient_communication": "bf16"})))
    assert bf16.training["gradient_communication"] == "bf16"
