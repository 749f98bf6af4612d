"""Which model a `model_name` means: a run or project folder stands for the model its run finished with."""

from __future__ import annotations

import json
import os

from leap_finetune.models.registry import resolve_model_id


def _run(project, name: str, finished_at: float | None, with_model: bool = True):
    run = project / name
    (run / "model").mkdir(parents=True)
    if with_model:
        (run / "model" / "config.json").write_text("{}")
    if finished_at is not None:
        (run / "summary.json").write_text(json.dumps({"finished_at": finished_at}))
        now = 5_000 - finished_at  # file times that say the opposite (another host's clock): the record decides
        os.utime(run / "summary.json", (now, now))
    return run


def test_a_project_folder_means_its_newest_finished_runs_model(tmp_path):
    project = tmp_path / "outputs" / "warmup"
    older = _run(project, "sft-20261201-120000", finished_at=1_000)
    newer = _run(project, "sft-20261201-110000", finished_at=2_000)  # (names do not decide: the end does)
    _run(project, "sft-20261201-130000", finished_at=None)  # still running, or interrupted: not finished
    _run(project, "sft-20261201-140000", finished_at=3_000, with_model=False)  # no final model
    assert resolve_model_id("outputs/warmup", tmp_path) == str(newer / "model")
    assert resolve_model_id("outputs/warmup/sft-20261201-120000", tmp_path) == str(older / "model")
    assert resolve_model_id(str(older / "model"), tmp_path) == str(older / "model")
    # a folder without any finished run stays as given (loading it then says what is missing)
    (tmp_path / "empty").mkdir()
    assert resolve_model_id("./empty", tmp_path) == str(tmp_path / "empty")


def test_a_run_or_project_without_a_finished_run_is_said_as_such(tmp_path):
    import pytest

    from leap_finetune.errors import LeapError

    run = tmp_path / "outputs" / "warmup" / "sft-20261201-120000"
    (run / "checkpoint-4").mkdir(parents=True)
    (run / "resolved_config.yaml").write_text("model_name: tiny-lfm2\n")  # started, never finished
    with pytest.raises(LeapError, match="none of its runs has finished .no model/ in sft-20261201-120000"):
        resolve_model_id("./outputs/warmup", tmp_path)
    with pytest.raises(LeapError, match="is a run that has not finished"):
        resolve_model_id("./outputs/warmup/sft-20261201-120000", tmp_path)
