"""Settings that were read past in silence, or refused in another library's words, said by `validate` (exit 2) with
where, why and the fix: `subset` on local data, and load_best_model_at_end without evaluation rows."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import EXAMPLES, invoke, tiny_config, write_config, write_jsonl


def _quickstart(workdir) -> None:
    (workdir / "data").mkdir()
    shutil.copy(EXAMPLES / "data" / "quickstart.jsonl", workdir / "data" / "quickstart.jsonl")


@pytest.mark.parametrize(
    ("dataset", "key", "what"),
    [
        ({"path": "data/quickstart.jsonl", "test_size": 0.15, "subset": "no"}, "dataset.subset", "a local file"),
        ({"path": "data", "subset": "default"}, "dataset.subset", "a local folder"),
        (
            [{"path": "data/quickstart.jsonl"}, {"path": "other.jsonl", "subset": "all"}],
            "dataset[1].subset",
            "a local file",
        ),
    ],
)
def test_subset_on_a_local_file_or_folder_is_refused(workdir, dataset, key, what):
    _quickstart(workdir)
    write_jsonl(workdir / "other.jsonl", [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant",
                                                                                        "content": "b"}]}] * 4)  # fmt: skip
    result = invoke("validate", str(write_config(workdir, tiny_config(dataset=dataset))), cwd=workdir)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in said, said
    assert f"{key}: {key} is " in said and f"is {what}: subset selects a configuration of a Hugging Face Hub" in said
    assert f"fix: remove {key}" in said


def test_a_hub_dataset_keeps_its_subset(workdir):
    """A Hub id is not refused for its subset (offline it fails later, as not in the cache, naming the subset)."""
    result = invoke(
        "validate", str(write_config(workdir, tiny_config(dataset={"path": "org/name", "subset": "no"}))), cwd=workdir
    )
    assert "subset selects a configuration" not in result.stderr and "subset 'no'" in result.stderr, result.stderr


def test_load_best_model_at_end_without_evaluation_rows_says_so(workdir):
    """Was TRL's 'Evaluation strategy: IntervalStrategy.NO' for a config that says eval_strategy: steps."""
    _quickstart(workdir)
    training = {"max_steps": 2, "load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 2,
                "save_steps": 2}  # fmt: skip
    config = tiny_config(dataset={"path": "data/quickstart.jsonl"}, training_config=training)
    result = invoke("validate", str(write_config(workdir, config)), cwd=workdir)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "IntervalStrategy" not in said, said
    assert "training_config.load_best_model_at_end keeps the checkpoint of the best evaluation, and there are no " \
           "evaluation rows" in said  # fmt: skip
    assert "fix: hold rows out for evaluation with dataset.test_size (e.g. 0.1) or give them as dataset.val_path " \
           "(valid rows" in said and "or remove load_best_model_at_end" in said  # fmt: skip
    # with evaluation rows the same keys are accepted
    config["dataset"]["test_size"] = 0.15
    assert invoke("validate", str(write_config(workdir, config)), cwd=workdir).returncode == 0
    # eval_strategy: no written by the user, eval rows or not: our words too (was TRL's 'IntervalStrategy.NO')
    config["training_config"]["eval_strategy"] = "no"
    result = invoke("validate", str(write_config(workdir, config)), cwd=workdir)
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "IntervalStrategy" not in said, said
    assert "and eval_strategy is no: nothing is evaluated, so there is no best checkpoint to keep" in said
