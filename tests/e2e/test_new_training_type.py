"""A training type added through the registry alone (methods.register): a copy of SFT under another name, with
SFT's recipe and profile, and not one line anywhere else. It goes the whole way - `init`, `validate`, a run
through leap_finetune.api (validate, plan, data, recipe, run folder) - so a list of type names still written by
hand somewhere, or read once when a module loads, fails here (docs/architecture.md, "The registry of training
types")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from leap_finetune import methods
from leap_finetune.api import run_config
from tests.conftest import EXAMPLES, fact_rows, invoke, tiny_config, write_config, write_jsonl


@pytest.fixture
def sft_copy():
    """SFT under another name, registered for this test only."""
    sft = methods.METHODS["sft"]
    toy = methods.register(dataclasses.replace(sft, name="sft_copy", recipe_module=sft.recipe_module))
    try:
        yield toy
    finally:
        del methods.METHODS[toy.name]


def test_a_type_registered_alone_is_known_to_init_and_validate(workdir, sft_copy):
    assert "sft_copy" in methods.training_types()
    assert invoke("init", "my.yaml", "--type", "sft_copy").returncode == 0
    starter = yaml.safe_load((workdir / "my.yaml").read_text())
    assert starter["training_type"] == "sft_copy" and starter["training_config"]["extends"] == "DEFAULT_SFT"
    checked = invoke("validate", "my.yaml", "--set", f"dataset.path={EXAMPLES / 'data' / 'quickstart.jsonl'}")
    assert checked.returncode == 0 and "valid" in checked.stderr, checked.stderr


def test_a_type_registered_alone_trains_and_its_run_records_it(workdir, sft_copy):
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    config = tiny_config(
        training_type="sft_copy",
        dataset={"path": "train.jsonl", "test_size": 8},
        training_config={"max_steps": 20, "eval_steps": 20, "learning_rate": 3e-3},
    )
    summary = run_config(write_config(workdir, config))
    assert summary["eval_loss"] < summary["initial_eval_loss"] * 0.8, summary
    run_dir = Path(summary["run_dir"])
    assert run_dir.name.startswith("sft_copy-")
    assert yaml.safe_load((run_dir / "resolved_config.yaml").read_text())["training_type"] == "sft_copy"
    assert "sft_copy" in (run_dir / "model" / "README.md").read_text()
