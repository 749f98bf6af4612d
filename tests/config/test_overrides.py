"""`--set KEY=VALUE`: values of the YAML replaced on the command line, checked exactly like the file."""

from __future__ import annotations

import json

import pytest

from leap_finetune.config.overrides import apply_overrides
from leap_finetune.errors import LeapError
from leap_finetune.validate.loader import load_config
from tests.conftest import chat, invoke, tiny_config, write_config, write_jsonl


def test_values_are_read_as_yaml_and_set_at_their_path():
    raw = {"training_config": {"learning_rate": 1e-3}, "dataset": [{"path": "a.jsonl"}, {"path": "b.jsonl"}]}
    out = apply_overrides(
        raw,
        [
            "training_config.learning_rate=1e-4",
            "dataset[1].weight=2",
            "dataset.0.limit=10",
            "training_config.packing=true",
            "peft_config.r=8",
            "evals.benchmarks=[]",
            "training_config.learning_rate=2e-4",
        ],
    )
    assert out["training_config"] == {"learning_rate": 2e-4, "packing": True}  # the later one wins
    assert out["dataset"] == [{"path": "a.jsonl", "limit": 10}, {"path": "b.jsonl", "weight": 2}]
    assert out["peft_config"] == {"r": 8} and out["evals"] == {"benchmarks": []}
    assert raw["training_config"]["learning_rate"] == 1e-3  # the file's values are not changed
    # a top-level key set to null is removed (a block switched off for this run); deeper, null is the value
    off = apply_overrides({"peft_config": {"r": 8}, "teacher": "t", "training_config": {"seed": 1}},
                          ["peft_config=null", "teacher=null", "training_config.seed=null"])  # fmt: skip
    assert off == {"training_config": {"seed": None}}


@pytest.mark.parametrize(
    "override, message",
    [
        ("training_config.learning_rate", "is not KEY=VALUE"),
        ("=3", "is not KEY=VALUE"),
        ("dataset[5].weight=1", "dataset has 2 item(s), so [5] is not one of them"),
        ("model_name.size=3", "model_name is a string, not a mapping"),
        ("training_config[0]=1", "training_config is not a list"),
        ("training_config..x=1", "'' is not a key"),
        ("training_config.x=[1, 2", "is not valid YAML"),
    ],
)
def test_a_malformed_override_is_a_clear_error(override, message):
    raw = {"model_name": "tiny-lfm2", "training_config": {}, "dataset": [{"path": "a"}, {"path": "b"}]}
    with pytest.raises(LeapError) as info:
        apply_overrides(raw, [override])
    assert message in info.value.format() and "--set" in info.value.format()


def test_an_override_gets_the_files_errors_naming_the_key(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [chat("q", "a")] * 8)
    config = write_config(tmp_path, tiny_config(data=str(path)))
    for override, message in (
        ("dataset.limit=-5", "dataset.limit is -5: expected a whole number > 0"),
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
    assert bad.returncode == 2 and "dataset.limit is 0: expected a whole number > 0" in bad.stderr
    assert "Traceback" not in bad.stderr
    plan = invoke(
        "plan",
        str(config),
        "--json",
        "--set",
        "dataset.limit=8",
        "--set",
        "training_config.per_device_train_batch_size=2",
    )
    assert plan.returncode == 0, plan.stderr
    assert '"rows": 8' in plan.stdout and '"steps_per_epoch": 4' in plan.stdout
    # `leap-finetune CONFIG --set ...` is `run` (the value after --set is not taken for the config)
    ran = invoke("--set", "training_config.max_steps=2", str(config), "--set", "dataset.limit=16", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    [run_dir] = list((tmp_path / "outputs" / "test").iterdir())
    written = (run_dir / "config.yaml").read_text()
    assert "#   --set training_config.max_steps=2\n#   --set dataset.limit=16" in written
    assert "max_steps: 2" in (run_dir / "resolved_config.yaml").read_text()
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == 2


def test_the_slurm_script_runs_the_config_with_the_same_overrides(tmp_path):
    from leap_finetune.config.schema_cluster import SlurmConfig
    from leap_finetune.launch.slurm import write_script

    path = write_jsonl(tmp_path / "train.jsonl", [chat("q", "a")] * 8)
    config = write_config(tmp_path, tiny_config(data=str(path)))
    resolved = load_config(config, overrides=["training_config.learning_rate=1e-4", "output_dir=/shared/my run"])
    script = write_script(resolved, SlurmConfig(), tmp_path / "slurm")
    text = script.read_text()
    assert f"run {config} --set training_config.learning_rate=1e-4 --set 'output_dir=/shared/my run'" in text


def _suggested_sets(text: str) -> list[str]:
    """The `--set ...` a fix text suggests, unquoted as a shell would."""
    import re
    import shlex

    return [shlex.split(quoted)[0] for quoted in re.findall(r"--set ('[^']+'|[^\s;,)]+)", text.split("fix:")[1])]


def test_every_set_a_fix_text_suggests_works(tmp_path):
    """`--set 'evals.benchmarks=[]'`, suggested for values that are not YAML, was refused (benchmarks needed
    at least one): each suggestion is taken from the message and applied to a config it fits."""
    rows = write_jsonl(tmp_path / "train.jsonl", [chat(f"q{i}", f"a{i}") for i in range(8)])
    bench = write_jsonl(tmp_path / "bench.jsonl", [chat("q", "a")])
    evals = {"benchmarks": [{"name": "b", "path": str(bench), "metric": "exact_match"}]}
    config = write_config(tmp_path, tiny_config(data=str(rows), evals=evals))
    other = write_jsonl(tmp_path / "other.jsonl", [chat(f"o{i}", f"b{i}") for i in range(8)])
    two_sources = write_config(tmp_path, tiny_config(dataset=[{"path": str(rows)}, {"path": str(other)}]), "two.yaml")
    with pytest.raises(LeapError) as info:
        load_config(config, overrides=["training_config.x=[1, 2"])
    suggested = _suggested_sets(info.value.format())
    assert suggested == ["evals.benchmarks=[]", "peft_config={extends: DEFAULT_LORA}"], suggested
    assert load_config(config, overrides=[suggested[0]]).evals is None  # no benchmarks, as without evals:
    assert load_config(config, overrides=[suggested[1]]).peft["r"] > 0
    with pytest.raises(LeapError) as info:
        load_config(two_sources, overrides=["dataset..weight=2"])
    suggested = _suggested_sets(info.value.format())
    assert suggested == ["training_config.learning_rate=1e-4", "dataset[1].epochs=2", "dataset.1.epochs=2"], suggested
    for override in suggested:
        load_config(two_sources, overrides=[override])
    reserved = {"mode": "reserved", "vllm_gpus": 0}
    with pytest.raises(LeapError) as info:  # benchmarks switched off, async evaluation still asked for
        load_config(config, overrides=["evals.benchmarks=[]", f"async_eval={json.dumps(reserved)}"])
    [suggested] = _suggested_sets(info.value.format())
    assert suggested == "async_eval.mode=sync"
    load_config(config, overrides=["evals.benchmarks=[]", f"async_eval={json.dumps(reserved)}", suggested])


@pytest.mark.parametrize("command", [["chat", "tiny-lfm2", "-p", "hi"], ["export", "some-run"], ["init", "new.yaml"]])
def test_commands_without_a_config_refuse_set_and_say_why(command, tmp_path):
    result = invoke(*command, "--set", "training_config.learning_rate=1e-4", cwd=tmp_path)
    assert (
        result.returncode == 2 and f"`{command[0]}` reads no config, so --set has no value to override" in result.stderr
    )
    assert "--set overrides a config's values on run, validate, inspect, plan, eval and slurm" in result.stderr
    assert not (tmp_path / "new.yaml").exists() and "Traceback" not in result.stderr
