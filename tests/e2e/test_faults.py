"""Nothing lost under faults, for real: kills and signals at chosen points (LEAP_FINETUNE_FAULT, no sleeping
to hit a moment), a second run in the same folder, config changes on resume, a full disk (a small tmpfs), a
run folder deleted under the run, forked data workers of a killed driver, a damaged byte, clock skew.

Each test names the failure it reproduces; every one of them lost data or gave an unclear error before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from leap_finetune.api import run_config, validate_config
from leap_finetune.errors import LeapError
from leap_finetune.runs.checkpoints import MARKER, verify
from tests.cli_process import CliProcess, start_cli
from tests.conftest import StopAt, fact_rows, invoke, tiny_config, write_config, write_jsonl
from tests.watchdog import Watchdog, communicate, run

# A learning rate that is not 0 at the end: one step too many changes the final weights.
BASE = {
    "max_steps": 8,
    "save_steps": 4,
    "learning_rate": 2e-3,
    "logging_steps": 1,
    "lr_scheduler_type": "constant",
    "save_total_limit": 5,
}


@pytest.fixture
def data(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    return workdir


def _config(folder: Path, project: str, name: str, dataset: dict | None = None, **training) -> Path:
    return write_config(
        folder,
        tiny_config(
            project_name=project, dataset=dataset or {"path": "train.jsonl"}, training_config={**BASE, **training}
        ),
        name,
    )


def _cli(
    config: Path, cwd: Path, fault: str | None = None, new_session: bool = False, args: tuple[str, ...] = ()
) -> CliProcess:
    return start_cli(*args, str(config), cwd=cwd, fault=fault, new_session=new_session)


def _steps(run_dir: Path) -> list[int]:
    return [
        json.loads(line)["step"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]


def _only_run(project: Path) -> Path:
    [run] = [p for p in project.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return run


def _weights(folder: Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def test_twin_runs_started_in_the_same_second_each_get_a_folder(data, monkeypatch):
    """Two new runs of one project started in the same second plan the same automatic name (`sft-<date>-<time>`).
    The one that finds the folder taken when it moves its own into place takes the next free name instead of
    failing - a sweep's runs all train. (Here the twin's folder appears between this run's plan and its write,
    where the race is.)"""
    from leap_finetune.launch import run_folder

    real = run_folder.write_run_folder
    twins = []

    def twin_got_there_first(resolved, prepared, renderer, plan):
        if not twins:  # (the first write only: the twin's folder, non-empty and locked as a live run's)
            from leap_finetune.launch.run_lock import RunLock

            plan.run_dir.mkdir(parents=True)
            (plan.run_dir / "config.yaml").write_text("the twin's\n")
            twins.append(RunLock.take(plan.run_dir))
        return real(resolved, prepared, renderer, plan)

    monkeypatch.setattr(run_folder, "write_run_folder", twin_got_there_first)
    try:
        summary = run_config(_config(data, "twins", "twin.yaml", max_steps=2))
    finally:
        twins[0].release()
    run_dir = Path(summary["run_dir"])
    assert run_dir.name == f"{twins[0].path.parent.name}-2" and summary["global_step"] == 2
    assert (twins[0].path.parent / "config.yaml").read_text() == "the twin's\n"  # (the twin's folder untouched)
    resolved = (run_dir / "resolved_config.yaml").read_text()
    assert f"run_dir: {run_dir}" in resolved or str(run_dir) in resolved


@pytest.mark.slow
def test_a_kill_while_saving_the_final_model_resumes_to_the_uninterrupted_weights(data):
    """SIGKILL after the final checkpoint, while the final model is being written (before: the resume trained
    step 9 of 8, logged it, and ended with other weights). Then SIGTERM during the final save: the run
    finishes (the end is the quickest safe place to stop) and says so."""
    reference = run_config(_config(data, "ref", "ref.yaml"))
    killed = _cli(_config(data, "cut", "cut.yaml"), data, fault="final-save=SIGKILL")
    _, stderr = communicate(killed)
    assert killed.returncode == -signal.SIGKILL, stderr[-3000:]
    run_dir = _only_run(data / "outputs" / "cut")
    assert verify(run_dir / "checkpoint-8").ok and not (run_dir / "summary.json").exists()
    assert (run_dir / ".model.partial").is_dir() and not (
        run_dir / "model"
    ).exists()  # killed mid-save, nothing in place

    resumed = run_config(_config(data, "cut", "resume.yaml", resume_from_checkpoint="latest"))
    assert resumed["global_step"] == 8 and _steps(run_dir) == list(range(1, 9))
    assert not (run_dir / ".model.partial").exists() and not (run_dir / "checkpoint-9").exists()
    # the final model is the final checkpoint's, bit for bit; and the uninterrupted run's, trained in another
    # process: equal up to float rounding, which Adam's normalised steps amplify for a few near-zero gradients.
    # One step more (the bug) moved every weight by about the learning rate (2e-3) on average.
    final, got = _weights(run_dir / "checkpoint-8"), _weights(run_dir / "model")
    assert final.keys() == got.keys() and all(torch.equal(final[k], got[k]) for k in final)
    expected = _weights(Path(reference["model_dir"]))
    drift = max(float((expected[k] - got[k]).abs().mean()) for k in expected)
    assert drift < 1e-4, drift
    assert resumed["train_loss"] == pytest.approx(reference["train_loss"], rel=1e-6)
    assert (run_dir / "README.md").exists()  # the card and report of a finished run

    os.environ["LEAP_FINETUNE_FAULT"] = "final-save=SIGTERM"  # (this process: run_config's handlers take it)
    try:
        finished = run_config(_config(data, "term", "term.yaml"))
    finally:
        del os.environ["LEAP_FINETUNE_FAULT"]
    assert finished["global_step"] == 8 and not finished.get("stopped_early")
    assert (Path(finished["model_dir"]) / "model.safetensors").exists()


@pytest.mark.slow
def test_sigterm_before_training_leaves_nothing_to_block_a_rerun(data, capfd):
    """SIGTERM while the model loads used to kill the run silently and leave a run folder without a checkpoint,
    which blocked both a re-run (not empty) and a resume (no checkpoint), each error pointing at the other."""
    output = data / "out"
    config = _config(data, "early", "early.yaml")
    text = config.read_text() + f"output_dir: {output}\n"
    config.write_text(text)
    os.environ["LEAP_FINETUNE_FAULT"] = "model-loading=SIGTERM"  # (the CLI's entry point in this process)
    try:
        stopped = invoke("run", str(config), cwd=data)
    finally:
        del os.environ["LEAP_FINETUNE_FAULT"]
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert (
        "stopped by SIGTERM before training started: nothing was saved (no checkpoint yet); the new run folder "
        "was removed" in " ".join(stopped.stderr.split())
    ), stopped.stderr[-2000:]
    assert "Traceback" not in stopped.stderr and not output.exists()


class DeleteRunFolder(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            import shutil

            shutil.rmtree(args.output_dir)


def test_a_run_folder_deleted_during_training_is_an_error_that_says_so(data):
    with pytest.raises(LeapError, match=r"the run folder was deleted while the run was training \(at step 2\)"):
        run_config(_config(data, "gone", "gone.yaml"), callbacks=[DeleteRunFolder()])


def test_config_changes_on_resume_are_refused_or_applied_from_the_resumed_step(data):
    """A changed learning_rate was ignored (the config table, resolved_config.yaml and the card showed the new
    value), a changed lr_scheduler_type took effect one step late, and the check was skipped when
    resolved_config.yaml or prepared/fingerprint.json was missing."""
    stopped = run_config(_config(data, "chg", "cut.yaml", lr_scheduler_type="linear"), callbacks=[StopAt(4)])
    run_dir = Path(stopped["run_dir"])
    (run_dir / "resolved_config.yaml").unlink()  # (a kill during a resume could remove these: the marker has them)
    (run_dir / "prepared" / "fingerprint.json").unlink()
    for change, shown in (
        ({"learning_rate": 1e-3}, "learning_rate: 0.002 -> 0.001"),
        ({"lr_scheduler_type": "cosine"}, "lr_scheduler_type: 'linear' -> 'cosine'"),
        ({"adam_beta2": 0.95}, "adam_beta2: (not set) -> 0.95"),  # (a key one side leaves out: not `None`)
    ):
        with pytest.raises(LeapError, match="changes how the run") as info:
            validate_config(
                _config(
                    data,
                    "chg",
                    "bad.yaml",
                    resume_from_checkpoint="latest",
                    **{"lr_scheduler_type": "linear", **change},
                )
            )
        assert shown in info.value.message and "resume_allow_changes: [" in info.value.fix
    # other data with the same keys: caught by the fingerprint the checkpoint recorded
    (data / "train.jsonl").rename(data / "kept.jsonl")
    write_jsonl(data / "train.jsonl", fact_rows(44))
    with pytest.raises(LeapError, match="the prepared training data"):
        validate_config(_config(data, "chg", "data.yaml", resume_from_checkpoint="latest", lr_scheduler_type="linear"))
    (data / "kept.jsonl").replace(data / "train.jsonl")
    with pytest.raises(LeapError, match="resume_allow_changes lists seed"):
        validate_config(
            _config(
                data,
                "chg",
                "never.yaml",
                resume_from_checkpoint="latest",
                lr_scheduler_type="linear",
                resume_allow_changes=["seed"],
            )
        )

    # allowed: the new schedule holds from the resumed step on, the first one included
    resumed = run_config(
        _config(
            data,
            "chg",
            "ok.yaml",
            resume_from_checkpoint="latest",
            learning_rate=1e-3,
            lr_scheduler_type="cosine",
            resume_allow_changes=["learning_rate", "lr_scheduler_type"],
        )
    )
    assert resumed["global_step"] == 8
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["learning_rate"] for r in records if "learning_rate" in r}
    import math

    # (transformers logs the rate the step used: the schedule's value at step - 1)
    assert rates[4] == pytest.approx(2e-3 * (1 - 3 / 8))  # linear from 0.002, before the resume
    for step in (5, 6, 7, 8):
        assert rates[step] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * (step - 1) / 8))), (step, rates)
    changes = json.loads((run_dir / "resume_changes.json").read_text())
    assert {(c["step"], c["key"], c["before"], c["now"]) for c in changes} == {
        (4, "training_config.learning_rate", 0.002, 0.001),
        (4, "training_config.lr_scheduler_type", "linear", "cosine"),
    }
    assert "| changed on resume at step 4 | learning_rate: 0.002 -> 0.001 |" in (run_dir / "README.md").read_text()


def test_a_byte_changed_in_a_checkpoint_is_caught(data):
    stopped = run_config(_config(data, "byte", "cut.yaml"), callbacks=[StopAt(4)])
    state = Path(stopped["run_dir"]) / "checkpoint-4" / "trainer_state.json"
    text = state.read_bytes()
    state.write_bytes(text.replace(b'"global_step": 4', b'"global_step": 5'))  # same size, one byte
    assert verify(state.parent).problem == "trainer_state.json changed since it was written (its SHA-256 differs)"
    with pytest.raises(LeapError, match="no complete checkpoint") as info:
        run_config(_config(data, "byte", "resume.yaml", resume_from_checkpoint="latest"))
    assert "checkpoint-4 is damaged (trainer_state.json changed" in info.value.message


def test_latest_follows_the_runs_own_record_not_file_times(data):
    """Clock skew (a file server's clock behind the trainer's) made `latest` pick the older run."""
    first = Path(run_config(_config(data, "skew", "a.yaml", max_steps=4))["run_dir"])
    second = Path(run_config(_config(data, "skew", "b.yaml", max_steps=4))["run_dir"])
    old = time.time() - 3600
    for marker in second.glob(f"checkpoint-*/{MARKER}"):
        os.utime(marker, (old, old))  # its files look an hour older than the first run's
    from leap_finetune.runs.checkpoints import latest_checkpoint

    assert first != second and latest_checkpoint(data / "outputs" / "skew") == second / "checkpoint-4"


def _wait_stopped(process: CliProcess) -> None:
    """Until the process stopped itself at its fault point (SIGSTOP)."""
    import psutil

    watchdog = Watchdog(process.pid, what="the run before its fault point")
    while psutil.Process(process.pid).status() != psutil.STATUS_STOPPED:
        assert process.poll() is None, process.communicate()[1][-3000:]
        watchdog.check()
        time.sleep(0.05)


@pytest.mark.slow
def test_one_live_run_per_folder(data):
    """Two resumes of one run both trained to the end in the same folder (steps logged twice), and two new runs
    with one output_dir failed with "check the disk space and permissions". The second is now an error naming
    the first's process and host, before it changes anything."""
    import socket

    run_dir = Path(run_config(_config(data, "twice", "cut.yaml"), callbacks=[StopAt(4)])["run_dir"])
    resume = _config(data, "twice", "resume.yaml", resume_from_checkpoint="latest")
    first = _cli(resume, data, fault="model-loading=SIGSTOP")  # holds the run folder, paused before training
    try:
        _wait_stopped(first)
        before = (run_dir / "metrics.jsonl").read_bytes()
        expected = f"another run is live in this folder: process {first.pid} on {socket.gethostname()}"
        with pytest.raises(LeapError, match=expected):
            run_config(resume)
        with pytest.raises(LeapError, match=expected):
            validate_config(resume)
        assert (run_dir / "metrics.jsonl").read_bytes() == before
    finally:
        first.send_signal(signal.SIGCONT)
    _, stderr = communicate(first)
    assert first.returncode == 0, stderr[-3000:]
    assert _steps(run_dir) == list(range(1, 9))

    # two new runs racing for one output_dir: the one that finds it taken says by whom (the lock is held here,
    # on a descriptor of its own, as another run's driver holds it)
    from leap_finetune.launch.run_lock import RunLock

    output = data / "shared-out"
    output.mkdir()
    config = _config(data, "x", "new.yaml")
    config.write_text(config.read_text() + f"output_dir: {output}\n")
    holder = RunLock.take(output)
    try:
        with pytest.raises(LeapError, match=f"another run is live in this folder: process {os.getpid()}"):
            run_config(config)
    finally:
        holder.release()
    assert run_config(config)["global_step"] == 8  # free again: the run takes the folder


@pytest.mark.slow
def test_a_killed_driver_takes_its_data_workers_with_it(data):
    """SIGKILL of the driver while the data is prepared left its forked workers (~550 MB each) alive."""
    import psutil

    config = _config(data, "prep", "prep.yaml", dataset={"path": "train.jsonl", "num_proc": 2})
    driver = _cli(config, data, fault="data-prep=SIGSTOP", new_session=True, args=("validate",))
    _wait_stopped(driver)
    workers = psutil.Process(driver.pid).children()
    assert len(workers) == 2, workers
    driver.kill()
    driver.communicate(timeout=60)
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, alive


@pytest.fixture
def small_disk(tmp_path):
    """A real file system of 24 MiB (tmpfs; the tests run as root, as CI does)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(folder)], check=True)
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.slow
def test_a_full_disk_is_an_error_that_says_so_and_the_run_resumes_after(data, small_disk, monkeypatch, capfd):
    """A full disk while saving a checkpoint ended in a raw traceback ("unexpected pos ..."); a data cache on a
    full disk made `validate` fail although the cache is optional."""
    output = small_disk / "run"
    config = _config(data, "full", "full.yaml", max_steps=12)
    config.write_text(config.read_text() + f"output_dir: {output}\n")
    result = invoke("run", str(config), cwd=data)
    assert result.returncode == 2, result.stderr[-3000:]
    text = " ".join(result.stderr.split())
    assert f"{output}: the disk is full at step" in text and "resume_from_checkpoint: latest" in text, text[-2000:]
    assert "Traceback" not in result.stderr
    assert verify(output / "checkpoint-4").ok  # the checkpoint before the full disk is intact

    subprocess.run(["mount", "-o", "remount,size=96m", str(small_disk)], check=True)  # space freed
    config.write_text(config.read_text().replace("save_steps: 4", "save_steps: 4\n  resume_from_checkpoint: latest"))
    capfd.readouterr()
    resumed = run_config(config)
    assert resumed["global_step"] == 12 and _steps(output) == list(range(1, 13))
    # the checkpoint the full disk cut short is named as it is removed
    err = " ".join(capfd.readouterr().err.split())
    assert "never completed (interrupted while saving): it is removed" in err, err[-3000:]

    # the data cache on a full disk: a note, and the data prepared without it
    cache = small_disk / "cache"
    cache.mkdir()
    filler = small_disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=200"], capture_output=True)  # (fills it)
    monkeypatch.setenv("LEAP_FINETUNE_CACHE", str(cache))
    write_jsonl(data / "more.jsonl", fact_rows(40))  # (rows not in any cache yet)
    checked = invoke("validate", str(_config(data, "cache", "cache.yaml", dataset={"path": "more.jsonl"})), cwd=data)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert "the data cache's disk is full" in " ".join(checked.stderr.split())


@pytest.mark.slow
def test_running_out_of_memory_names_the_settings_to_change(data):
    """A batch that does not fit ended in an allocation traceback. The CLI runs with its address space capped at
    8 GiB (RLIMIT_AS: the allocator fails for real, and nothing else on the machine is at risk) and a batch of 48
    rows of ~4,000 tokens whose attention alone needs more."""
    import resource

    long_rows = [
        {
            "messages": [
                {"role": "user", "content": f"Repeat {w}."},
                {"role": "assistant", "content": " ".join([w] * 2000)},
            ]
        }
        for w in ["red", "blue", "teal", "gold"] * 12
    ]
    write_jsonl(data / "long.jsonl", long_rows)
    config = _config(
        data,
        "oom",
        "oom.yaml",
        dataset={"path": "long.jsonl"},
        per_device_train_batch_size=48,
        max_length=4096,
        max_steps=2,
    )

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200"}
    result = run(
        [sys.executable, "-m", "leap_finetune.cli", str(config)], what="the run", cwd=data, env=env, preexec_fn=cap
    )
    text = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr[-3000:]
    assert "training_config: out of memory at step 0 (per_device_train_batch_size 48, max_length 4096" in text, text[
        -2000:
    ]
    assert "lower per_device_train_batch_size (raise gradient_accumulation_steps" in text
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_sigterm_to_every_process_of_the_job_checkpoints_a_run_with_data_loader_workers(data):
    """scancel, preemption and systemd signal every process of a job, the data-loader workers too: the workers
    leave the signal to the training process, which saves a checkpoint and stops (a worker killed by it made the
    training process crash while saving, and the run was lost)."""
    import psutil

    config = _config(data, "workers", "workers.yaml", dataloader_num_workers=2, save_steps=2)
    driver = _cli(config, data, fault="checkpoint-saved=SIGSTOP", new_session=True)
    _wait_stopped(driver)  # after the checkpoint of step 2, the workers running
    workers = psutil.Process(driver.pid).children(recursive=True)
    assert len(workers) >= 2, [(p.pid, p.name(), p.cmdline()) for p in workers]
    os.killpg(driver.pid, signal.SIGTERM)  # every process of the job, as scancel does
    os.killpg(driver.pid, signal.SIGCONT)
    _, stderr = communicate(driver)
    assert driver.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "DataLoader worker" not in stderr and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.count("SIGTERM received") == 1, stderr[-3000:]  # the training process's notice, once
    assert "checkpoint saved" in stderr
    run_dir = _only_run(data / "outputs" / "workers")
    saved = sorted(int(p.name.split("-")[1]) for p in run_dir.glob("checkpoint-*"))
    assert saved[-1] > 2 and verify(run_dir / f"checkpoint-{saved[-1]}").ok, saved
    gone, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive, alive
