"""A run SIGKILLed during start-up (before its first checkpoint), then resumed or run again: `latest` never reaches
past it to an older run, and a plain re-run into output_dir replaces only what a run wrote (tests/e2e/test_faults.py's
fault hooks and helpers; split from it)."""

from __future__ import annotations

import json
import signal

import pytest

from tests.conftest import fact_rows, invoke, write_jsonl
from tests.e2e.test_faults import _cli, _config
from tests.watchdog import communicate


@pytest.fixture
def data(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    return workdir


def test_a_run_killed_during_start_up_in_output_dir_is_replaced_by_a_plain_rerun(data):
    """With output_dir, a run SIGKILLed during start-up left a folder without a checkpoint, and the two errors
    contradicted each other: the resume said "remove resume_from_checkpoint: the run then starts afresh, in a new
    run folder", the plain re-run said "remove the folder". Now the resume's advice is true: the plain re-run starts
    afresh in output_dir, saying what it replaced - and a finished run there is never replaced."""
    output = data / "outputs" / "killed"
    config = _config(data, "killed", "killed.yaml", max_steps=4, save_steps=2)
    config.write_text(config.read_text() + f"output_dir: {output}\n")
    killed = _cli(config, data, fault="model-loading=SIGKILL")
    communicate(killed)
    assert killed.returncode == -signal.SIGKILL and (output / "resolved_config.yaml").exists()
    assert not list(output.glob("checkpoint-*"))

    resume = invoke("run", str(config), "--set", "training_config.resume_from_checkpoint=latest", cwd=data)
    said = " ".join(resume.stderr.split())
    assert resume.returncode == 2 and "stopped before its first complete checkpoint" in said, said[-3000:]
    assert f"a plain re-run then starts afresh in output_dir {output}" in said and "new run folder" not in said

    (output / "notes.txt").write_text("mine")  # a file of the user's beside the leftovers: nothing is replaced
    kept = invoke("run", str(config), cwd=data)
    said = " ".join(kept.stderr.split())
    assert kept.returncode == 2 and "it also holds files no run wrote (notes.txt)" in said, said[-3000:]
    assert "fix: move your files out and run again" in said and "rm -r" not in said
    assert (output / "notes.txt").read_text() == "mine"
    (output / "notes.txt").unlink()

    again = invoke("run", str(config), cwd=data)
    said = " ".join((again.stdout + again.stderr).split())
    assert again.returncode == 0, said[-3000:]
    assert f"output_dir {output} holds what a run stopped before its first checkpoint left (" in said
    assert "this run starts afresh there and replaces it" in said
    assert json.loads((output / "summary.json").read_text())["global_step"] == 4
    log = (output / "train.log").read_text().splitlines()
    assert sum(line.startswith("==== ") for line in log) == 1  # (a new run's log, not the killed run's continued)
    assert [p.name for p in output.parent.iterdir()] == ["killed"]  # nothing set aside is left beside it

    final = invoke("run", str(config), cwd=data)  # a finished run is never replaced
    assert final.returncode == 2 and "the output folder exists and is not empty" in final.stderr
    assert json.loads((output / "summary.json").read_text())["global_step"] == 4


def test_latest_never_resumes_an_older_run_past_a_newer_one_killed_during_start_up(data):
    """A finished run, then a longer one SIGKILLed during start-up (no checkpoint): `latest` (and `true`) resumed the
    older, finished run's checkpoint-4, trained it on and overwrote its model and summary. Now the newest run is the
    one `latest` means: it has nothing to resume, and the error names it and the older run's checkpoint."""
    short = _config(data, "audit", "short.yaml", max_steps=4, save_steps=2)
    finished = invoke("run", str(short), cwd=data)
    assert finished.returncode == 0, finished.stderr[-3000:]
    project = data / "outputs" / "audit"
    (older,) = list(project.iterdir())
    kept = {p: p.read_bytes() for p in (older / "summary.json", older / "model" / "model.safetensors")}
    longer = _config(data, "audit", "long.yaml", max_steps=12, save_steps=2)
    killed = _cli(longer, data, fault="model-loading=SIGKILL")
    communicate(killed)
    assert killed.returncode == -signal.SIGKILL
    (newest,) = [p for p in project.iterdir() if p != older and not p.name.startswith(".")]
    assert not list(newest.glob("checkpoint-*"))

    for value in ("latest", "true"):
        resumed = invoke("run", str(longer), "--set", f"training_config.resume_from_checkpoint={value}", cwd=data)
        said = " ".join(resumed.stderr.split())
        assert resumed.returncode == 2, (value, said[-3000:])
        assert f"the newest run, {newest}, stopped before its first complete checkpoint" in said
        assert "the run then starts afresh, in a new run folder" in said
        assert f"to continue the older run {older.name}, name its checkpoint: {older / 'checkpoint-4'}" in said
    assert {p: p.read_bytes() for p in kept} == kept
    assert sorted(p.name for p in older.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    named = invoke(
        "validate", str(longer), "--set", f"training_config.resume_from_checkpoint={older / 'checkpoint-4'}", cwd=data
    )  # the advice holds: the older run's checkpoint, named, is resumed
    assert named.returncode == 0 and f"(resuming from {older / 'checkpoint-4'})" in " ".join(named.stderr.split())
