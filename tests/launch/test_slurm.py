"""`leap-finetune slurm` against a real SLURM cluster: Debian's slurmctld + slurmd on this machine
(scripts/slurm_local.sh, started by .ci/run and, if needed, by the fixture below). The quickstart runs
as a SLURM job end to end, with Ray brought up inside the allocation, stopped by scancel with a checkpoint and
resumed by a second job; the script is the one docs/distributed.md shows."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from leap_finetune.launch.slurm import script_text
from leap_finetune.validate.loader import load_config
from tests.conftest import EXAMPLES, REPO, invoke, write_config
from tests.watchdog import Watchdog

QUICK = {
    "project_name": "slurm-quickstart",
    "model_name": "tiny-lfm2",
    "dataset": {"path": "data/quickstart.jsonl", "test_size": 12},
    "training_config": {
        "max_steps": 20,
        "per_device_train_batch_size": 8,
        "learning_rate": 3e-3,
        "warmup_steps": 0,
        "logging_steps": 5,
        "eval_steps": 20,
        "save_steps": 20,
        "max_length": 128,
    },
    "slurm": {"time": "00:15:00", "cpus_per_task": 2},
}


@pytest.fixture(scope="module")
def slurm_cluster():
    """The one-node cluster; a missing SLURM is a failure here, not a skip."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm_local.sh")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert shutil.which("sbatch")


def test_the_script_is_the_one_the_readme_shows():
    page = (REPO / "docs" / "distributed.md").read_text()
    shown = re.search(r"<!-- slurm script -->\n```bash\n(.*?)```", page, re.S).group(1)
    resolved = load_config(EXAMPLES / "sft_lfm2_slurm.yaml")
    text = script_text(
        resolved, resolved.slurm, Path("/shared/runs/outputs/lfm2-sft-slurm/slurm"), python="/shared/venv/bin/python"
    )
    assert text.replace(str(EXAMPLES), "/shared/runs") == shown


def _job_watchdog(job: str) -> Watchdog:
    """The CPU time of the job's processes (those with its SLURM_JOB_ID): fails when the job hangs, not when the
    machine is slow."""

    def pids():
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("SLURM_JOB_ID") == job:
                    found.append(process.pid)
            except psutil.Error:
                continue
        return found

    return Watchdog(pids, what=f"SLURM job {job}")


def _wait_for_job(job: str) -> None:
    watchdog = _job_watchdog(job)
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        watchdog.check()
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
    from leap_finetune.runs.checkpoints import MARKER, verify

    shutil.copytree(EXAMPLES / "data", workdir / "data")
    config = write_config(
        workdir, {**QUICK, "training_config": {**QUICK["training_config"], "max_steps": 40, "save_steps": 5}}
    )
    project = workdir / "outputs" / "slurm-quickstart"
    job = _submit(workdir, config)
    watchdog = _job_watchdog(job)
    while not list(project.glob(f"sft-*/checkpoint-*/{MARKER}")):
        assert subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip(), (
            "no checkpoint before the job ended"
        )
        watchdog.check()  # (it reads every process's environment: twice a second is often enough)
        time.sleep(0.5)
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
    assert (run / "model" / "config.json").exists() and json.loads((run / "summary.json").read_text())[
        "global_step"
    ] == 40
    steps = [
        json.loads(line)["step"]
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]
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
    # a time in no SLURM format is refused by leap-finetune itself (also where no sbatch could check it)
    wrong_time = write_config(workdir, {**QUICK, "slurm": {**QUICK["slurm"], "time": "soon"}}, "time.yaml")
    result = invoke("slurm", str(wrong_time), cwd=workdir)
    assert result.returncode == 2 and "slurm.time is 'soon': expected a SLURM time limit" in result.stderr
    monkeypatch.setenv("PATH", str(workdir))  # a login node without SLURM
    good = write_config(workdir, QUICK, "good.yaml")
    result = invoke("slurm", str(good), "--submit", cwd=workdir)
    assert result.returncode == 2 and "sbatch is not installed here" in result.stderr
    written = invoke("slurm", str(good), cwd=workdir)  # without --submit: the script alone, said so
    assert written.returncode == 0 and "sbatch is not installed here: copy it" in " ".join(written.stderr.split())


def test_sbatch_values_are_one_line_and_options_sbatch_reads_as_written(workdir):
    """A newline in extra_sbatch became a shell line of the job script, and a quote in job_name made sbatch stop
    ("Unmatched") with an error that blamed the cluster: `validate` refuses them, naming the key."""
    for slurm, message in (
        ({"job_name": "a\nb"}, "slurm.job_name holds a newline ('a\\nb'): it is written into one #SBATCH line"),
        ({"partition": "gpu\r"}, "slurm.partition holds a carriage return"),
        ({"extra_sbatch": ["--qos=high", "--comment=x\nrm -rf ~"]}, "slurm.extra_sbatch[1] holds a newline"),
        (
            {"extra_sbatch": ["--comment=it's"]},
            'slurm.extra_sbatch[0] is "--comment=it\'s": sbatch would stop with "Unmatched `\'`"',
        ),
        ({"extra_sbatch": ["--comment=run #2"]}, "sbatch reads '#2' as a comment and drops it"),
        ({"extra_sbatch": ["--comment=my run"]}, "sbatch would read 'run' as a directive of its own"),
        ({"extra_sbatch": ["qos=high"]}, "slurm.extra_sbatch[0] is 'qos=high': expected sbatch options"),
    ):
        result = invoke("validate", str(write_config(workdir, {**QUICK, "slurm": slurm})), cwd=workdir)
        assert result.returncode == 2 and message in " ".join(result.stderr.split()), (slurm, result.stderr)
    # the evaluation jobs' #SBATCH lines too
    sidecar = {**QUICK, "async_eval": {"mode": "sidecar", "sbatch": {"partition": "eval\n#SBATCH --mem=0"}}}
    result = invoke("validate", str(write_config(workdir, sidecar)), cwd=workdir)
    assert result.returncode == 2 and "async_eval.sbatch.partition holds a newline" in result.stderr, result.stderr
    # the job's Ray cluster is started with CPU and GPU counts: a custom resource would keep its workers waiting
    shutil.copytree(EXAMPLES / "data", workdir / "data")
    custom = {**QUICK, "ray": {"resources_per_worker": {"my_res": 1}}}
    result = invoke("slurm", str(write_config(workdir, custom)), cwd=workdir)
    assert (
        result.returncode == 2
        and "ray.resources_per_worker asks for my_res, and the run would start a Ray cluster "
        "of its own in the SLURM job, with CPU, GPU and memory only"
        in " ".join(result.stderr.split())
    ), result.stderr
    assert not (workdir / "outputs").exists()


def test_a_job_name_with_quotes_and_a_folder_with_spaces_reach_slurm_as_written(slurm_cluster, workdir):
    """Values sbatch would split or cut (spaces, quotes, `#`, `%` in the log folder) are quoted its way: the held
    job has the job name as written (read back from SLURM), its log in the folder the command announces."""
    folder = workdir / "my runs 100%"
    shutil.copytree(EXAMPLES / "data", folder / "data")
    name = 'it\'s "my" run #2'
    config = write_config(
        folder,
        {**QUICK, "slurm": {**QUICK["slurm"], "job_name": name, "extra_sbatch": ['--comment="a b # c"', "--hold"]}},
    )
    result = invoke("slurm", str(config), cwd=folder)
    assert result.returncode == 0 and "sbatch --test-only accepts it" in " ".join(result.stderr.split()), result.stderr
    [script] = (folder / "outputs" / "slurm-quickstart" / "slurm").glob("*.sbatch")
    assert script.name.startswith("it-s-my-run-2-")
    job = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, check=True).stdout
    job = job.strip().split(";")[0]
    try:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["scancel", job], check=True)
    assert f"JobName={name}\n" in shown and "Comment=a b # c" in shown, shown
    # (scontrol shows --output's pattern with %j filled in and `%%`, SLURM's own escape of a `%`, as written)
    assert f"StdOut={folder}/outputs/slurm-quickstart/slurm/slurm-{job}.out".replace("%", "%%") in shown, shown


def test_stop_steps_kills_only_the_jobs_step_processes_on_this_node():
    """The cleanup's `stop-steps`: a cancelled job's steps (Ray under `keep-running`, SIGTERM blocked) end at once,
    not at SLURM's KillWait; the batch script's own processes (no SLURM_STEP_ID) and another job's are left alone."""
    import os
    import sys

    def sleeper(**env):
        return subprocess.Popen(
            [sys.executable, "-m", "leap_finetune.launch.slurm", "keep-running", "--", "sleep", "60"],
            env={**os.environ, **env},
        )

    step = sleeper(SLURM_JOB_ID="4242", SLURM_STEP_ID="1")
    batch = sleeper(SLURM_JOB_ID="4242")
    other = sleeper(SLURM_JOB_ID="4243", SLURM_STEP_ID="1")
    try:
        wait_until = time.time() + 30
        while not all(Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"sleep") for p in (step, batch, other)):
            assert time.time() < wait_until, "the keep-running processes did not exec sleep"
            time.sleep(0.05)
        step.send_signal(15)  # (SIGTERM is blocked: only SIGKILL ends it)
        assert (
            subprocess.run(
                [sys.executable, "-m", "leap_finetune.launch.slurm", "stop-steps", "--job", "4242"]
            ).returncode
            == 0
        )
        assert step.wait(timeout=10) == -9
        assert batch.poll() is None and other.poll() is None
    finally:
        for process in (step, batch, other):
            process.kill()
            process.wait()
