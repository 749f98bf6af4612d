"""async_eval mode `sidecar`: one sbatch job per evaluation, running `leap-finetune eval` on a snapshot,
polled with scontrol until it ends (run by the driver, launch/evaluator.py, on the snapshots rank 0 hands over)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from leap_finetune.config.cluster_values import sbatch_value
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.errors import LeapError
from leap_finetune.evaluation.snapshot import Outcome, Snapshot
from leap_finetune.runs.processes import NO_MULTICAST

POLL_S = 1.0
# A pending job with one of these reasons will not start by waiting (held, or over a limit of its partition,
# account or QOS): counted as a failed evaluation at once, not waited for until the end of training.
NEVER_STARTS = {
    "JobHeldUser",
    "JobHeldAdmin",
    "PartitionTimeLimit",
    "PartitionNodeLimit",
    "PartitionConfig",
    "PartitionDown",
    "PartitionInactive",
    "AccountNotAllowed",
    "InvalidAccount",
    "InvalidQOS",
    "QOSMaxWallDurationPerJobLimit",
    "QOSMaxGRESPerJob",
    "BadConstraints",
    "DependencyNeverSatisfied",
}
FINISHED_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "REVOKED",
    "SPECIAL_EXIT",
}


def job_script(resolved: ResolvedConfig, snapshot: Snapshot, jobs: Path) -> str:
    """The sbatch script of one evaluation: `leap-finetune eval` on the snapshot with vllm_gpus GPUs (a vLLM
    server inside the job answers the generation benchmarks when vLLM is installed there)."""
    from leap_finetune.evaluation.server import vllm_server_flags
    from leap_finetune.models.vision import is_vision_model

    settings = resolved.async_eval
    python = shlex.quote(sys.executable)
    run = re.sub(r"[^A-Za-z0-9._-]", "_", Path(resolved.run_dir).name if resolved.run_dir else resolved.project_name)
    # (#SBATCH lines follow sbatch's own quoting, not the shell's: values through sbatch_value; --output, a path,
    # goes on sbatch's command line instead, see sidecar_job)
    directives = [f"--job-name=leap-eval-{run}-step-{snapshot.step}", "--ntasks=1", f"--time={settings.sbatch.time}"]
    if settings.vllm_gpus:
        directives.append(f"--gpus={settings.vllm_gpus}")
    for key, value in (("partition", settings.sbatch.partition), ("account", settings.sbatch.account)):
        if value:
            directives.append(f"--{key}={sbatch_value(value)}")
    exports = " ".join(f"{k}={v}" for k, v in NO_MULTICAST.items())
    # A CPU evaluator (vllm_gpus: 0) may share the training machine's cores: it yields to training (nice).
    nice = "" if settings.vllm_gpus else "nice -n 19 "
    folder = shlex.quote(str(snapshot.folder))
    eval_cmd = f'{nice}"$PYTHON" -m leap_finetune.cli eval {folder}/eval.yaml --output {folder}/results.json'
    lines = [
        "#!/bin/bash",
        f"# leap-finetune: the evaluation of training step {snapshot.step} of {resolved.run_dir} (sidecar).",
        *[f"#SBATCH {d}" for d in directives],
        "",
        "set -euo pipefail",
        f"export {exports}",
        f"PYTHON={python}",
        f"cd {folder}",
    ]
    if not settings.vllm_gpus:  # a CPU evaluator: no GPU (not the trainer's, inherited), the CPUs SLURM gave it
        lines += ["export CUDA_VISIBLE_DEVICES=", "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}"]
    # vLLM answers text generation; a vision-language model is evaluated in the job through transformers
    if settings.vllm_gpus and not is_vision_model(resolved.model_id):
        lines += [
            "# vLLM answers the generation benchmarks when it is installed; otherwise transformers generates.",
            'if "$PYTHON" -c "import vllm" 2>/dev/null; then',
            "  port=$((20000 + SLURM_JOB_ID % 20000))",
            f'  "$PYTHON" -m vllm.entrypoints.openai.api_server --model {folder}/model --host 127.0.0.1 '
            f'--port "$port" --tensor-parallel-size {settings.tensor_parallel_size} --gpu-memory-utilization '
            f"{settings.gpu_memory_utilization} --served-model-name snapshot"
            + "".join(f" {flag}" for flag in vllm_server_flags(resolved))
            + " &",
            "  server=$!",
            "  trap 'kill \"$server\" 2>/dev/null || true' EXIT",
            '  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; '
            'kill -0 "$server" || exit 1; sleep 1; done',
            f'  {eval_cmd} --server "http://127.0.0.1:$port/v1" --server-model snapshot',
            "else",
            f"  {eval_cmd}",
            "fi",
        ]
    else:
        lines.append(eval_cmd)
    return "\n".join(lines) + "\n"


def _submit(resolved: ResolvedConfig, script: Path, output: str, stop: threading.Event) -> str | Outcome:
    """sbatch the script: the job id, or why it was refused after async_eval.failure.max_submit_attempts tries
    (a busy controller refuses for a moment: each try waits submit_retry_backoff seconds, doubled, before the next)."""
    failure = resolved.async_eval.failure
    extra = list(resolved.async_eval.sbatch.extra_args)
    for attempt in range(1, failure.max_submit_attempts + 1):
        submitted = subprocess.run(
            ["sbatch", "--parsable", output, *extra, str(script)],
            capture_output=True,
            start_new_session=True,
            text=True,
            timeout=120,
        )
        if submitted.returncode == 0:
            return submitted.stdout.strip().split(";")[0]
        if attempt < failure.max_submit_attempts and stop.wait(failure.submit_retry_backoff * 2 ** (attempt - 1)):
            break  # (training ended while waiting to try again)
    said = [
        line.strip()
        for line in (submitted.stderr + submitted.stdout).splitlines()
        if line.strip() and not line.startswith("Try ")
    ]
    return Outcome(
        reason=f"sbatch rejected the job ({attempt} tr{'y' if attempt == 1 else 'ies'}): "
        + ("; ".join(said) or f"exit code {submitted.returncode}"),
        log=script,
    )


def sidecar_job(resolved: ResolvedConfig, snapshot: Snapshot, jobs: Path, stop: threading.Event) -> Outcome:
    """Submit, then poll the job (scontrol) until it ends; COMPLETED with a results file is a success."""
    jobs.mkdir(parents=True, exist_ok=True)
    script = jobs / f"step-{snapshot.step}.sbatch"
    script.write_text(job_script(resolved, snapshot, jobs), encoding="utf-8")
    submitted = _submit(resolved, script, f"--output={jobs}/step-{snapshot.step}-%j.out", stop)
    if isinstance(submitted, Outcome):
        return submitted
    job = submitted
    log = jobs / f"step-{snapshot.step}-{job}.out"
    results = snapshot.folder / "results.json"
    state, detail, reason = "PENDING", "", None
    while True:
        if stop.is_set():
            subprocess.run(["scancel", job], capture_output=True, start_new_session=True, timeout=60)
            return Outcome(
                reason=f"SLURM job {job} cancelled while {state}" + (f" ({detail})" if detail else ""), log=log
            )
        shown = subprocess.run(
            ["scontrol", "show", "job", "-o", job], capture_output=True, start_new_session=True, text=True, timeout=60
        )
        if shown.returncode == 0:
            found = re.search(r"JobState=(\S+)", shown.stdout)
            state = found.group(1) if found else state
            reason = re.search(r"Reason=(\S+)", shown.stdout)
            code = re.search(r"ExitCode=(\S+)", shown.stdout)
            detail = ", ".join(
                x
                for x in (
                    f"exit code {code.group(1)}" if code else "",
                    f"reason {reason.group(1)}" if reason and reason.group(1) != "None" else "",
                )
                if x
            )
        elif "Invalid job id" in shown.stderr:  # finished and already purged by the controller
            state = "COMPLETED" if results.exists() else "GONE"
        if state in FINISHED_STATES or state == "GONE":
            break
        if state == "PENDING" and reason and reason.group(1) in NEVER_STARTS:
            subprocess.run(["scancel", job], capture_output=True, start_new_session=True, timeout=60)
            return Outcome(
                reason=f"SLURM job {job} cannot start (Reason={reason.group(1)}); it was cancelled", log=script
            )  # (the job never ran: its script is the thing to read)
        time.sleep(POLL_S)
    if state == "COMPLETED" and results.exists():
        return Outcome(results=json.loads(results.read_text(encoding="utf-8"))["results"], log=log)
    if state == "COMPLETED":
        return Outcome(reason=f"SLURM job {job} completed without writing results", log=log)
    return Outcome(reason=f"SLURM job {job} ended {state}" + (f" ({detail})" if detail else ""), log=log)


def check_sbatch_accepts(resolved: ResolvedConfig, where: str) -> None:
    """`sbatch --test-only` on an evaluation job's script: a partition, account, time or extra option that SLURM
    would reject is an error now, not a failed evaluation at every eval step."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        script = folder / "check.sbatch"
        script.write_text(job_script(resolved, Snapshot(0, "check", folder), folder), encoding="utf-8")
        checked = subprocess.run(
            [
                "sbatch",
                "--test-only",
                f"--output={folder}/check.out",
                *resolved.async_eval.sbatch.extra_args,
                str(script),
            ],
            capture_output=True,
            start_new_session=True,
            text=True,
            timeout=120,
        )
    if checked.returncode != 0:
        said = [
            line.strip()
            for line in (checked.stderr + checked.stdout).splitlines()
            if line.strip() and not line.startswith("Try ")
        ]
        gpus = resolved.async_eval.vllm_gpus
        raise LeapError(
            "sbatch would reject the evaluation jobs (checked with sbatch --test-only): " + "; ".join(said),
            where=f"{resolved.config_path or 'config'}: async_eval.sbatch",
            fix="fix async_eval.sbatch (partition, account, time, extra_args) for this cluster"
            + (
                f"; each job asks for --gpus={gpus} (async_eval.vllm_gpus): a cluster without GPUs needs vllm_gpus: 0"
                if gpus
                else ""
            ),
        )
