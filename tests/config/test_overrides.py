"""`--set KEY=VALUE`: values of the YAML replaced on the command line, checked exactly like the file."""

from __future__ import annotations

import json

import pytest

from leap_finetune.config.loader import load_config
from leap_finetune.config.overrides import apply_overrides
from leap_finetune.errors import LeapError
from tests.conftest import chat, invoke, tiny_config, write_config, write_jsonl


def test_values_are_read_as_yaml_and_set_at_their_path():
    raw = {"training_config": {"learning_rate": 1e-3}, "dataset": [{"path": "a.jsonl"}, {"path": "b.jsonl"}]}
    out = apply_overrides(raw, ["training_config.learning_rate=1e-4", "dataset[1].weight=2", "dataset.0.limit=10",
                                "training_config.packing=true", "peft_config.r=8", "evals.benchmarks=[]",
                                "training_config.learning_rate=2e-4"])
    assert out["training_config"] == {"learning_rate": 2e-4, "packing": True}  # the later one wins
    assert out["dataset"] == [{"path": "a.jsonl", "limit": 10}, {"path": "b.jsonl", "weight": 2}]
    assert out["peft_config"] == {"r": 8} and out["evals"] == {"benchmarks": []}
    assert raw["training_config"]["learning_rate"] == 1e-3  # the file's values are not changed


@pytest.mark.parametrize("override, message", [
    ("training_config.learning_rate", "is not KEY=VALUE"),
    ("=3", "is not KEY=VALUE"),
    ("dataset[5].weight=1", "dataset has 2 item(s), so [5] is not one of them"),
    ("model_name.size=3", "model_name is a string, not a mapping"),
    ("training_config[0]=1", "training_config is not a list"),
    ("training_config..x=1", "'' is not a key"),
    ("training_config.x=[1, 2", "is not valid YAML"),
])
def test_a_malformed_override_is_a_clear_error(override, message):
    raw = {"model_name": "tiny-lfm2", "training_config": {}, "dataset": [{"path": "a"}, {"path": "b"}]}
    with pytest.raises(LeapError) as info:
        apply_overrides(raw, [override])
    assert message in info.value.format() and "--set" in info.value.format()


def test_an_override_gets_the_files_errors_naming_the_key(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [chat("q", "a")] * 8)
    config = write_config(tmp_path, tiny_config(data=str(path)))
    for override, message in (
        ("dataset.limit=-5", "dataset.limit: Input should be greater than 0 (got -5)"),
        ("training_config.learning_rat=1e-4", "unknown key 'learning_rat' in training_config"),
        ("dataset.limt=5", "unknown key 'limt' in dataset"),
        ("training_type=sftt", "sftt"),
    ):
        with pytest.raises(LeapError) as info:
            load_config(config, overrides=[override])
        text = info.value.format()
        assert message in text and f"--set {override}" in text, text
    resolved = load_config(config, overrides=["training_config.learning_rate=1e-4", "dataset.limit=4"])
    assert resolved.training["learning_rate"] == 1e-4 and resolved.dataset.limit == 4
    assert resolved.overrides == ["training_config.learning_rate=1e-4", "dataset.limit=4"]


def test_the_cli_takes_set_on_every_command_and_the_run_folder_records_it(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [chat(f"q{i}", f"a{i}") for i in range(24)])
    config = write_config(tmp_path, tiny_config(data=str(path)))
    bad = invoke("validate", str(config), "--set", "dataset.limit=0")
    assert bad.returncode == 2 and "dataset.limit: Input should be greater than 0" in bad.stderr
    assert "Traceback" not in bad.stderr
    plan = invoke("plan", str(config), "--json", "--set", "dataset.limit=8", "--set",
                  "training_config.per_device_train_batch_size=2")
    assert plan.returncode == 0, plan.stderr
    assert '"rows": 8' in plan.stdout and '"steps_per_epoch": 4' in plan.stdout
    # `leap-finetune CONFIG --set ...` is `run` (the value after --set is not taken for the config)
    ran = invoke("--set", "training_config.max_steps=2", str(config), "--set", "dataset.limit=16",
                 cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    [run_dir] = list((tmp_path / "outputs" / "test").iterdir())
    written = (run_dir / "config.yaml").read_text()
    assert "#   --set training_config.max_steps=2\n#   --set dataset.limit=16" in written
    assert "max_steps: 2" in (run_dir / "resolved_config.yaml").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == 2


def test_the_slurm_script_runs_the_config_with_the_same_overrides(tmp_path):
    from leap_finetune.config.schema import SlurmConfig
    from leap_finetune.launch.slurm import write_script

    path = write_jsonl(tmp_path / "train.jsonl", [chat("q", "a")] * 8)
    config = write_config(tmp_path, tiny_config(data=str(path)))
    resolved = load_config(config, overrides=["training_config.learning_rate=1e-4", "output_dir=/shared/my run"])
    script = write_script(resolved, SlurmConfig(), tmp_path / "slurm")
    text = script.read_text()
    assert f"run {config} --set training_config.learning_rate=1e-4 --set 'output_dir=/shared/my run'" in text
