"""async_eval sidecar: each evaluation a job of the real one-node SLURM cluster (scripts/slurm_local.sh; CPU,
vllm_gpus: 0). Its results, logged at the training step of each snapshot, equal the sync run's at the same steps and
training does not wait for them; jobs that cannot run are counted, and evaluation is switched off after
`failure.max_consecutive` of them while training finishes. (Reserved mode: test_async_eval.py.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from leap_finetune.api import run_config
from tests.conftest import REPO
from tests.evaluation.async_runs import async_config, failures_by_step, one_core_each, scores_by_step, sync_run

__all__ = ["one_core_each", "sync_run"]  # (fixtures of this module, defined with the runs they set up)


@pytest.fixture(scope="module")
def slurm_cluster():
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm_local.sh")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_sidecar_jobs_give_the_sync_results_and_training_does_not_wait(slurm_cluster, workdir, sync_run, capfd):
    sync_summary, sync_scores = sync_run
    assert sorted(sync_scores) == [0, 3, 6, 9, 12]
    assert sync_scores[0]["benchmark/mcq/score"] != sync_scores[12]["benchmark/mcq/score"]  # the model learned
    summary = run_config(async_config(workdir, "sidecar", "sidecar.yaml", on_overlap="skip"))
    run_dir = Path(summary["run_dir"])
    scores = scores_by_step(run_dir)
    # every evaluation that ran gives the sync run's results at that training step, logged at that step
    assert 0 in scores and 12 in scores
    for step, result in scores.items():
        assert result == pytest.approx(sync_scores[step], rel=1e-6), step
    assert summary["benchmarks"] == pytest.approx(sync_summary["benchmarks"])
    assert summary["initial_benchmarks"] == pytest.approx(sync_summary["initial_benchmarks"])
    # each evaluation was a real SLURM job that completed; its log is kept, its snapshot deleted
    logs = sorted((run_dir / "benchmarks" / "jobs").glob("step-*-*.out"))
    assert len(logs) == len(scores)
    for log in logs:
        job = log.stem.split("-")[-1]
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        assert "JobState=COMPLETED" in shown, shown
    assert not (run_dir / "benchmarks" / "snapshots").exists()
    assert sorted(p.name for p in (run_dir / "benchmarks" / "results").iterdir()) == sorted(
        f"step-{s}.json" for s in scores
    )
    # the newest evaluation's predictions, as in sync mode
    for name in ("capitals", "mcq"):
        rows = [json.loads(line) for line in (run_dir / "benchmarks" / f"{name}.jsonl").read_text().splitlines()]
        assert rows and {"prompt", "prediction", "score"} <= set(rows[0]), name
    err = capfd.readouterr().err
    skipped = [s for s in (3, 6, 9) if s not in scores]
    for step in skipped:  # on_overlap: skip says so
        assert f"evaluation of step {step} skipped" in err
    # training did not pause for the evaluations (sync paused at steps 3, 6 and 9)
    assert summary["train_runtime_s"] < 0.8 * sync_summary["train_runtime_s"], (
        summary["train_runtime_s"],
        sync_summary["train_runtime_s"],
    )
    print(f"training time: sidecar {summary['train_runtime_s']:.1f} s, sync {sync_summary['train_runtime_s']:.1f} s")


def test_jobs_that_cannot_run_are_counted_and_evaluation_is_switched_off(slurm_cluster, workdir, capfd):
    from leap_finetune.api import validate_config
    from leap_finetune.errors import LeapError

    # an option sbatch rejects is found at validate (sbatch --test-only on an evaluation job's script)
    rejected = async_config(workdir, "sidecar", "rejected.yaml", sbatch={"extra_args": ["--no-such-option=1"]})
    with pytest.raises(LeapError, match="sbatch would reject the evaluation jobs .*no-such-option"):
        validate_config(rejected)
    # jobs SLURM accepts but that cannot start (held): each is cancelled and counted; after 2, evaluation is off
    config = async_config(
        workdir, "sidecar", "held.yaml", sbatch={"extra_args": ["--hold"]}, failure={"max_consecutive": 2}
    )
    summary = run_config(config)
    assert summary["global_step"] == 12 and summary["model_dir"]  # training finished
    run_dir = Path(summary["run_dir"])
    assert failures_by_step(run_dir) == {0: 1.0, 3: 2.0}
    assert scores_by_step(run_dir) == {}
    err = " ".join(capfd.readouterr().err.split())
    assert "evaluation at step 0 (before training) failed: SLURM job" in err
    assert "cannot start (Reason=JobHeldUser); it was cancelled" in err
    assert "evaluation switched off for the rest of the run after 2 failed evaluations in a row" in err
    assert not (run_dir / "benchmarks" / "snapshots").exists()
    left = subprocess.run(["squeue", "-h", "-n", f"leap-eval-{run_dir.name}-step-0"], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_a_refused_submission_is_tried_again_as_failure_says(slurm_cluster, workdir):
    """async_eval.failure.max_submit_attempts / submit_retry_backoff: sbatch refusing a job (here: a partition the
    cluster does not have) is tried that many times, waiting backoff, 2x backoff, ... between tries; training's end
    (the stop event) ends the waiting."""
    import threading
    import time

    from leap_finetune.evaluation.sidecar import _submit
    from leap_finetune.validate.loader import load_config

    config = async_config(
        workdir, "sidecar", "retry.yaml", failure={"max_submit_attempts": 3, "submit_retry_backoff": 0.4}
    )
    resolved = load_config(config)
    script = workdir / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --partition=no-such-partition\ntrue\n", encoding="utf-8")
    start = time.monotonic()
    outcome = _submit(resolved, script, f"--output={workdir}/%j.out", threading.Event())
    waited = time.monotonic() - start
    assert "sbatch rejected the job (3 tries)" in outcome.reason and "partition" in outcome.reason.lower()
    assert waited >= 0.4 + 0.8  # the two waits between the three tries
    stop = threading.Event()
    stop.set()
    outcome = _submit(resolved, script, f"--output={workdir}/%j.out", stop)
    assert "(1 try)" in outcome.reason  # training ended: no second try
