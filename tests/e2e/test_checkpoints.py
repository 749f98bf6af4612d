"""Nothing lost: checkpoints are resumed from only when complete, rotation never leaves a marked
half-deleted folder, and a resumed run's losses, metrics and summary are those of the uninterrupted
run, however it was interrupted (in-process stop, damaged files, SIGKILL at many points)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from leap_finetune.api import run_config
from leap_finetune.errors import LeapError
from leap_finetune.runs.checkpoints import MARKER, verify
from tests.cli_process import CliProcess, start_cli
from tests.conftest import StopAt, fact_rows, tiny_config, write_config, write_jsonl
from tests.watchdog import communicate

BASE = {
    "max_steps": 8,
    "save_steps": 2,
    "save_total_limit": 2,
    "learning_rate": 2e-3,
    "eval_steps": 4,
    "lr_scheduler_type": "cosine",
    "logging_steps": 1,
}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _losses(run_dir: Path) -> dict[int, float]:
    losses: dict[int, float] = {}
    for record in _records(run_dir):
        if "loss" in record:
            assert record["step"] not in losses, f"step {record['step']} logged twice"
            losses[record["step"]] = record["loss"]
    return losses


def _assert_same_losses(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    for step, loss in expected.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), step


@pytest.fixture
def data(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    return workdir


def _config(folder: Path, project: str, name: str, **training) -> Path:
    return write_config(
        folder,
        tiny_config(
            project_name=project, dataset={"path": "train.jsonl", "test_size": 8}, training_config={**BASE, **training}
        ),
        name,
    )


def test_a_damaged_checkpoint_is_skipped_and_the_resume_reproduces_the_run(data):
    full = run_config(_config(data, "full", "full.yaml"))
    stopped = run_config(_config(data, "cut", "cut.yaml"), callbacks=[StopAt(6)])
    run_dir = Path(stopped["run_dir"])
    # our rotation kept the newest two (save_total_limit: 2), each verified
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    assert verify(run_dir / "checkpoint-6").ok
    manifest = json.loads((run_dir / "checkpoint-6" / MARKER).read_text())
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json", "model.safetensors"} <= set(manifest["files"])

    # The state a SIGKILL during transformers' own rotation left (3 of 3 times before): the marker is
    # there but the optimizer is gone. It must not be resumed from with a fresh optimizer.
    (run_dir / "checkpoint-6" / "optimizer.pt").unlink()
    assert verify(run_dir / "checkpoint-6").problem == "optimizer.pt is missing"
    with pytest.raises(LeapError, match="cannot be resumed from: optimizer.pt is missing"):
        run_config(_config(data, "cut", "explicit.yaml", resume_from_checkpoint=str(run_dir / "checkpoint-6")))
    # a file cut short is caught by its recorded size
    scheduler = run_dir / "checkpoint-4" / "scheduler.pt"
    original = scheduler.read_bytes()
    scheduler.write_bytes(original[:-10])
    assert "scheduler.pt has" in verify(run_dir / "checkpoint-4").problem
    scheduler.write_bytes(original)

    resumed = run_config(_config(data, "cut", "resume.yaml", resume_from_checkpoint="latest"))
    assert resumed["run_dir"] == str(run_dir)
    _assert_same_losses(_losses(run_dir), _losses(Path(full["run_dir"])))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 8
    assert summary["initial_eval_loss"] == pytest.approx(full["initial_eval_loss"], rel=1e-6)
    assert summary["train_loss"] == pytest.approx(full["train_loss"], rel=1e-5)
    assert summary["eval_loss"] == pytest.approx(full["eval_loss"], rel=1e-5)
    assert [r["step"] for r in _records(run_dir) if "eval_loss" in r] == [0, 4, 8]


def test_re_running_a_finished_run_says_it_is_finished_and_changes_nothing(data):
    full = run_config(_config(data, "done", "full.yaml"))
    run_dir = Path(full["run_dir"])
    before = {name: (run_dir / name).read_bytes() for name in ("summary.json", "metrics.jsonl")}
    again = run_config(_config(data, "done", "again.yaml", resume_from_checkpoint="latest"))
    assert again["already_finished"] and again["global_step"] == 8
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    # asking for more steps continues from the last checkpoint
    longer = run_config(_config(data, "done", "longer.yaml", resume_from_checkpoint="latest", max_steps=10))
    assert longer["global_step"] == 10 and not longer.get("already_finished")
    assert sorted(_losses(run_dir)) == list(range(1, 11))


def _cli(config: Path, cwd: Path, fault: str | None = None) -> CliProcess:
    """The CLI in a process of its own, killed at `fault` (LEAP_FINETUNE_FAULT); one training process (no GPUs:
    with several, the run would go through Ray and the fault would kill a worker instead)."""
    return start_cli(str(config), cwd=cwd, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, fault=fault)


def _checkpoints(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])) if run_dir.exists() else []


@pytest.mark.slow
def test_sigkill_at_many_points_then_resume_reproduces_the_uninterrupted_run(data):
    """Saves every step with save_total_limit 1 (so a rotation follows every save), and the CLI is killed with
    SIGKILL at chosen points (LEAP_FINETUNE_FAULT): while a checkpoint is being written (files there, no marker),
    while the old one is being deleted (unmarked, its files still there), and between saves. Each restart resumes
    with `latest`; at the end every step is logged once with the uninterrupted run's loss, and the summary covers
    the whole run."""
    steps = 12
    training = {"max_steps": steps, "save_steps": 1, "save_total_limit": 1, "eval_steps": 6}
    reference = run_config(_config(data, "ref", "ref.yaml", **training))
    start = _config(data, "killed", "start.yaml", **training)
    resume = _config(data, "killed", "resume.yaml", resume_from_checkpoint="latest", **training)
    project = data / "outputs" / "killed"

    def run_dir() -> Path:
        [found] = [p for p in project.iterdir() if p.is_dir() and not p.name.startswith(".")]
        return found

    def state() -> dict[str, bool]:  # checkpoint folder -> marked complete
        return {p.name: (p / MARKER).exists() for p in _checkpoints(run_dir())}

    # (the N-th time the process reaches the point; a resumed process counts from its own start: it first deletes
    # the unmarked checkpoint the last kill left, then rotates the one it resumed from away)
    kills = [
        (start, "checkpoint-written#3", {"checkpoint-2": True, "checkpoint-3": False}),  # mid-save
        (resume, "checkpoint-deleting#2", {"checkpoint-2": False, "checkpoint-3": True}),  # mid-rotation
        (resume, "checkpoint-saved#2", {"checkpoint-5": True}),
    ]  # between saves
    for config, point, expected in kills:
        proc = _cli(config, data, fault=f"{point}=SIGKILL")
        _, stderr = communicate(proc)
        assert proc.returncode == -signal.SIGKILL, (point, stderr[-3000:])
        assert state() == expected, (point, state())
    final = _cli(resume, data)
    _, stderr = communicate(final)
    assert final.returncode == 0, stderr[-3000:]

    reference_dir = Path(reference["run_dir"])
    _assert_same_losses(_losses(run_dir()), _losses(reference_dir))
    assert [r["step"] for r in _records(run_dir()) if "eval_loss" in r] == [0, 6, 12]
    summary = json.loads((run_dir() / "summary.json").read_text())
    assert summary["global_step"] == steps
    assert summary["initial_eval_loss"] == pytest.approx(reference["initial_eval_loss"], rel=1e-6)
    assert summary["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-5)
    assert [p.name for p in _checkpoints(run_dir())] == [f"checkpoint-{steps}"]


def test_a_resume_must_continue_the_same_run(data):
    stopped = run_config(_config(data, "same", "cut.yaml"), callbacks=[StopAt(6)])
    run_dir = Path(stopped["run_dir"])
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} | {
        "metrics": (run_dir / "metrics.jsonl").read_bytes()
    }
    write_jsonl(data / "other.jsonl", fact_rows(40))
    changes = {
        "model": (dict(model_name="tiny-lfm2.5"), "model_id: 'tiny-lfm2' -> 'tiny-lfm2.5'"),
        "lora": (dict(peft_config={"extends": "DEFAULT_LORA"}), "peft: None ->"),
        "batch": (
            dict(training_config={**BASE, "per_device_train_batch_size": 2, "resume_from_checkpoint": "latest"}),
            "the global batch (per_device_train_batch_size x gradient_accumulation_steps x workers): 4 -> 2",
        ),
    }
    for name, (overrides, expected) in changes.items():
        config = tiny_config(
            project_name="same",
            dataset={"path": "train.jsonl", "test_size": 8},
            training_config={**BASE, "resume_from_checkpoint": "latest"},
        )
        config.update(overrides)
        with pytest.raises(LeapError, match="changes what the run") as info:
            run_config(write_config(data, config, f"{name}.yaml"))
        assert expected in info.value.format(), (name, info.value.format())
    # the same settings on other rows: caught by the prepared data's fingerprint
    (data / "train.jsonl").rename(data / "kept.jsonl")
    write_jsonl(data / "train.jsonl", fact_rows(44))
    with pytest.raises(LeapError, match="the prepared training data"):
        run_config(_config(data, "same", "data.yaml", resume_from_checkpoint="latest"))
    (data / "kept.jsonl").replace(data / "train.jsonl")
    # resuming an older checkpoint in place would discard checkpoint-6
    with pytest.raises(LeapError, match=r"newer complete checkpoints \(checkpoint-6\)"):
        run_config(_config(data, "same", "old.yaml", resume_from_checkpoint=str(run_dir / "checkpoint-4")))
    # (a run folder given instead of a checkpoint resumes from its newest one: test_resume_takes_the_habits_...)
    # none of these touched the run
    after = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} | {
        "metrics": (run_dir / "metrics.jsonl").read_bytes()
    }
    assert after == before
    resumed = run_config(_config(data, "same", "ok.yaml", resume_from_checkpoint="latest"))
    assert resumed["global_step"] == 8


def test_resume_takes_the_habits_of_other_tools(data):
    """`resume_from_checkpoint: true` (the HF Trainer's "last checkpoint"), a checkpoint path typed relative to the
    shell's folder, and a run folder instead of a checkpoint all resume; a path found nowhere names both bases; a
    run folder left before its first checkpoint says that a plain re-run starts afresh - and it does."""
    import shutil

    from tests.conftest import invoke

    configs = data / "configs"
    configs.mkdir()
    (configs / "train.jsonl").write_text((data / "train.jsonl").read_text())
    config = _config(configs, "habits", "cut.yaml")
    run_dir = Path(run_config(config, callbacks=[StopAt(4)])["run_dir"])
    newest = run_dir / "checkpoint-4"

    def planned(*sets: str) -> tuple[int, str]:
        result = invoke("validate", str(config), *(a for s in sets for a in ("--set", s)), cwd=data)
        return result.returncode, " ".join(result.stderr.split())

    typed_here = os.path.relpath(newest, data)  # (configs/outputs/...: the shell's view, not the config's)
    for value in ("true", typed_here, str(run_dir)):
        code, text = planned(f"training_config.resume_from_checkpoint={value}")
        assert code == 0 and f"(resuming from {newest})" in text, (value, text)
    assert (
        "is a run folder: resuming from its newest complete checkpoint, checkpoint-4"
        in planned(f"training_config.resume_from_checkpoint={run_dir}")[1]
    )
    code, text = planned("training_config.resume_from_checkpoint=nowhere/checkpoint-9")
    assert code == 2 and "no such checkpoint folder" in text and str(configs) in text and str(data) in text, text

    # a run folder a kill during start-up left (no checkpoint): the message says a plain re-run starts afresh
    for checkpoint in run_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    code, text = planned("training_config.resume_from_checkpoint=latest")
    assert code == 2 and "stopped before its first complete checkpoint" in text, text
    assert "remove resume_from_checkpoint: the run then starts afresh, in a new run folder" in text
    code, text = planned(f"training_config.resume_from_checkpoint={run_dir}")
    assert code == 2 and "no complete checkpoint to resume from" in text and "starts afresh" in text, text
    again = run_config(config)
    assert Path(again["run_dir"]) != run_dir and again["global_step"] == BASE["max_steps"]
