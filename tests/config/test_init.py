"""`leap-finetune init`: a starter config per training type, and the config's JSON schema for editors."""

from __future__ import annotations

import json

import jsonschema
import pytest

from leap_finetune.config.starters import schema_path, schema_text
from leap_finetune.config.yaml_io import read_yaml
from leap_finetune.methods import TRAINING_TYPES
from tests.conftest import EXAMPLES, invoke


def _validator():
    return jsonschema.Draft202012Validator(json.loads(schema_path().read_text()))


def test_the_shipped_schema_is_generated_from_the_current_config_schema():
    assert schema_path().read_text() == schema_text(), "run: python scripts/gen_config_docs.py"


def test_every_example_config_follows_the_json_schema_and_mistakes_do_not():
    validator = _validator()
    examples = sorted(EXAMPLES.glob("*.yaml"))
    for path in examples:
        errors = [e.message for e in validator.iter_errors(read_yaml(path))]
        assert not errors, f"{path.name}: {errors}"
    for broken, what in (
        ({"project_name": "x", "model_name": "m", "datset": {"path": "a"}}, "datset"),
        ({"project_name": "x", "model_name": "m", "dataset": {"path": "a", "limit": 0}}, "0"),
        ({"project_name": "x", "model_name": "m", "dataset": [{"path": "a", "weight": "x"}]}, "'x'"),
    ):
        assert any(what in e.message for e in validator.iter_errors(broken)), broken


@pytest.mark.parametrize("training_type", TRAINING_TYPES)
def test_init_writes_a_starter_that_validates_once_it_has_data(tmp_path, training_type):
    data = {
        "sft": "quickstart.jsonl",
        "distill": "quickstart.jsonl",
        "dpo": "dpo.jsonl",
        "kto": "kto.jsonl",
        "grpo": "grpo_math.jsonl",
        "embedding": "retrieval_train.jsonl",
        "colbert": "retrieval_train.jsonl",
    }[training_type]
    target = tmp_path / "my.yaml"
    result = invoke("init", str(target), "--type", training_type)
    assert result.returncode == 0, result.stderr
    text = target.read_text()
    first = text.splitlines()[0]
    assert first == f"# yaml-language-server: $schema={schema_path().as_uri()}" and schema_path().exists()
    assert not list(_validator().iter_errors(read_yaml(target)))
    sets = ["--set", f"dataset.path={EXAMPLES / 'data' / data}"]
    if training_type in ("embedding", "colbert"):
        sets += ["--set", f"dataset.val_path={EXAMPLES / 'data' / 'retrieval_held_out.jsonl'}"]
    if training_type == "grpo":
        sets += ["--set", "training_config.use_vllm=false"]
    checked = invoke("validate", str(target), *sets)
    assert checked.returncode == 0, checked.stderr
    assert "valid" in checked.stderr


def test_init_refuses_to_overwrite_and_names_the_training_types(tmp_path):
    target = tmp_path / "config.yaml"
    target.write_text("mine")
    again = invoke("init", str(target))
    assert again.returncode == 2 and "the file exists" in again.stderr and "--force" in again.stderr
    assert target.read_text() == "mine"
    assert invoke("init", str(target), "--force").returncode == 0 and target.read_text() != "mine"
    typo = invoke("init", str(tmp_path / "x.yaml"), "--type", "dpoo")
    assert typo.returncode == 2 and "did you mean 'dpo'" in typo.stderr
    assert invoke("init", str(tmp_path / "x.txt")).returncode == 2
