"""`leap-finetune slurm` against a real SLURM cluster: Debian's slurmctld + slurmd on this machine
(scripts/slurm_local.sh, started by .ci/run and, if needed, by the fixture below). The quickstart runs
as a SLURM job end to end, with Ray brought up inside the allocation, stopped by scancel with a checkpoint and
resumed by a second job; the script is the README's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from leap_finetune.config.loader import load_config
from leap_finetune.launch.slurm import script_text
from tests.conftest import EXAMPLES, REPO, invoke, write_config

QUICK = {"project_name": "slurm-quickstart", "model_name": "tiny-lfm2",
         "dataset": {"path": "data/quickstart.jsonl", "test_size": 12},
         "training_config": {"max_steps": 20, "per_device_train_batch_size": 8, "learning_rate": 3e-3,
                             "warmup_steps": 0, "logging_steps": 5, "eval_steps": 20, "save_steps": 20,
                             "max_length": 128},
         "slurm": {"time": "00:15:00", "cpus_per_task": 2}}


@pytest.fixture(scope="module")
def slurm_cluster():
    """The one-node cluster; a missing SLURM is a failure here, not a skip."""
    result = subprocess.run(["bash", str(REPO / "scripts" / "slurm_local.sh")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert shutil.which("sbatch")


def test_the_script_is_the_one_the_readme_shows():
    readme = (REPO / "README.md").read_text()
    shown = re.search(r"<!-- slurm script -->\n```bash\n(.*?)```", readme, re.S).group(1)
    resolved = load_config(EXAMPLES / "sft_lfm2_slurm.yaml")
    text = script_text(resolved, resolved.slurm, Path("/shared/runs/outputs/lfm2-sft-slurm/slurm"),
                       python="/shared/venv/bin/python")
    assert text.replace(str(EXAMPLES), "/shared/runs") == shown


def _wait_for_job(job: str, timeout: float = 900) -> None:
    deadline = time.time() + timeout
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.time() < deadline, "the job did not finish"
        time.sleep(1)


def _submit(workdir: Path, config: Path, *sets: str) -> str:
    result = invoke("slurm", str(config), "--submit", *[a for s in sets for a in ("--set", s)], cwd=workdir)
    assert result.returncode == 0, result.stderr
    return re.search(r"submitted job (\d+)", " ".join(result.stderr.split())).group(1)


@pytest.mark.slow
def test_scancel_saves_a_checkpoint_and_the_job_resumes_to_the_end(slurm_cluster, workdir):
    """The quickstart as a SLURM job, Ray brought up inside the allocation. `scancel` (SIGTERM to every process of
    the job) used to leave no checkpoint at the stop and a log full of Ray stack dumps: now the run saves a
    checkpoint after the step and stops (Ray's processes outlive the SIGTERM until it is written), and a second
    job resumes it to the end."""
    from leap_finetune.recipes.checkpoints import MARKER, verify

    shutil.copytree(EXAMPLES / "data", workdir / "data")
    config = write_config(workdir, {**QUICK, "training_config": {**QUICK["training_config"], "max_steps": 40,
                                                                 "save_steps": 5}})
    project = workdir / "outputs" / "slurm-quickstart"
    job = _submit(workdir, config)
    deadline = time.time() + 600
    while not list(project.glob(f"sft-*/checkpoint-*/{MARKER}")):
        assert time.time() < deadline and subprocess.run(["squeue", "-h", "-j", job], capture_output=True,
                                                         text=True).stdout.strip(), "no checkpoint before the job ended"
        time.sleep(0.2)
    subprocess.run(["scancel", job], check=True)
    _wait_for_job(job)
    log = (project / "slurm" / f"slurm-{job}.out").read_text()
    text = " ".join(log.split())
    assert "SIGTERM received: saving a checkpoint after this step, then stopping" in text, log[-3000:]
    [run] = [p for p in project.iterdir() if p.name.startswith("sft-")]
    summary = json.loads((run / "summary.json").read_text())
    stopped = summary["global_step"]
    assert summary["stopped_by_signal"] == 15 and 5 <= stopped < 40, summary
    assert f"stopped at step {stopped} (checkpoint saved)" in text and verify(run / f"checkpoint-{stopped}").ok
    assert "Traceback" not in log and "SystemExit" not in log, log[-3000:]
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=CANCELLED" in state, state
    _no_ray_left(job)

    job = _submit(workdir, config, "training_config.resume_from_checkpoint=latest")
    _wait_for_job(job)
    log = (project / "slurm" / f"slurm-{job}.out").read_text()
    assert "ray: 1 node(s), 0 GPU(s) joined" in log and "done: 40 steps" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]  # e.g. Ray Train's placement-group cleaner without a dashboard
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state
    assert (run / "model" / "config.json").exists() and json.loads((run / "summary.json").read_text())["global_step"] == 40
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == list(range(5, 41, 5))  # every logged step once, across the two jobs
    _no_ray_left(job)


def _no_ray_left(job: str) -> None:
    deadline = time.time() + 60  # (SLURM ends the job's steps after its batch script)
    while subprocess.run(["pgrep", "-f", f"ray-leap-{job}"], capture_output=True, text=True).stdout.strip():
        assert time.time() < deadline, "Ray processes of the job are still running"
        time.sleep(1)


def test_keys_sbatch_would_reject_and_a_missing_sbatch(slurm_cluster, workdir, monkeypatch):
    shutil.copytree(EXAMPLES / "data", workdir / "data")
    bad = write_config(workdir, {**QUICK, "slurm": {**QUICK["slurm"], "partition": "no-such-partition"}}, "bad.yaml")
    result = invoke("slurm", str(bad), "--submit", cwd=workdir)
    assert result.returncode == 2 and "sbatch would reject the job" in result.stderr, result.stderr
    assert "invalid partition" in result.stderr.lower() or "no-such-partition" in result.stderr
    assert subprocess.run(["squeue", "-h", "-n", "slurm-quickstart"], capture_output=True, text=True).stdout == ""
    wrong_time = write_config(workdir, {**QUICK, "slurm": {**QUICK["slurm"], "time": "soon"}}, "time.yaml")
    result = invoke("slurm", str(wrong_time), cwd=workdir)
    assert result.returncode == 2 and "sbatch would reject the job" in result.stderr, result.stderr
    monkeypatch.setenv("PATH", str(workdir))  # a login node without SLURM
    good = write_config(workdir, QUICK, "good.yaml")
    result = invoke("slurm", str(good), "--submit", cwd=workdir)
    assert result.returncode == 2 and "sbatch is not installed here" in result.stderr
    written = invoke("slurm", str(good), cwd=workdir)  # without --submit: the script alone, said so
    assert written.returncode == 0 and "sbatch is not installed here: copy it" in " ".join(written.stderr.split())
