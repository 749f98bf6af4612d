"""`leap-finetune slurm`: a readable sbatch script that runs a config on a SLURM allocation.

The script brings up a Ray cluster over the allocation (the head on the first node, one `ray start`
per other node through `srun`), waits until every node and GPU has joined, runs `leap-finetune run`
against it (RAY_ADDRESS), and always stops Ray when it ends (a trap on EXIT). SLURM schedules and
Ray Train runs the workers; the script only glues them, in the order the Ray documentation gives
for SLURM. Steps use `srun --overlap` so the Ray daemons and the driver share the allocation.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from leap_finetune.config.cluster_values import sbatch_value
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.schema_cluster import SlurmConfig
from leap_finetune.errors import LeapError
from leap_finetune.runs.processes import NO_MULTICAST


def script_text(resolved: ResolvedConfig, slurm: SlurmConfig, log_folder: Path, python: str | None = None) -> str:
    """The script; `python` is the interpreter the job runs (default: this one, whose environment has
    leap-finetune and Ray)."""
    python = python or sys.executable
    ray_cli = str(Path(python).with_name("ray"))
    nodes, gpus = slurm.nodes, slurm.gpus_per_node
    exports = " ".join(f"{k}={v}" for k, v in {**NO_MULTICAST, "RAY_USAGE_STATS_ENABLED": "0"}.items())
    config = shlex.quote(resolved.config_path or "CONFIG.yaml")
    lines = [
        "#!/bin/bash",
        (
            f"# leap-finetune: {one_line(str(resolved.config_path))} on {nodes} node(s) x {gpus} GPU(s), Ray Train over "
            "the allocation."
        ),
        "# Written by `leap-finetune slurm`; submit with: sbatch <this file>",
        *[f"#SBATCH {d}" for d in _directives(resolved, slurm, log_folder)],
        "",
        "set -euo pipefail",
        *slurm.setup,
        f"export {exports}",
        f"PYTHON={shlex.quote(python)}",
        f"RAY={shlex.quote(ray_cli)}",
        "# This job's Ray cluster answers only to this job (a token of its own, handed down by srun).",
        "export RAY_AUTH_MODE=token",
        "export RAY_AUTH_TOKEN=$(\"$PYTHON\" -c 'import secrets; print(secrets.token_hex(32))')",
        'ray_tmp="/tmp/ray-leap-$SLURM_JOB_ID"',
        "",
        *_ray_cluster_lines(slurm),
        f'"$PYTHON" -m leap_finetune.cli run {config}'
        + "".join(f" --set {shlex.quote(o)}" for o in resolved.overrides)
        + " &",
        "run=$!",
        "trap 'echo \"leap-finetune: SIGTERM: the run saves a checkpoint and stops\"; kill -TERM $run 2>/dev/null || true' TERM",
        "status=0",
        "wait $run || status=$?",
        "while kill -0 $run 2>/dev/null; do status=0; wait $run || status=$?; done  # (a trap interrupts wait)",
        "exit $status",
        "",
    ]
    return "\n".join(lines)


def _directives(resolved: ResolvedConfig, slurm: SlurmConfig, log_folder: Path) -> list[str]:
    """The #SBATCH lines' values: the job, its nodes and time, the log; the slurm: keys given; extra_sbatch."""
    nodes, gpus = slurm.nodes, slurm.gpus_per_node
    directives = [
        f"--job-name={sbatch_value(slurm.job_name or resolved.project_name)}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--time={sbatch_value(slurm.time)}",
        f"--output={sbatch_value(log_pattern(log_folder))}",
    ]
    if gpus:
        directives.append(f"--gpus-per-node={gpus}")
    if slurm.stop_before_time_limit_s:
        directives.append(f"--signal=B:TERM@{slurm.stop_before_time_limit_s}")
    for key, value in (
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("mem", slurm.mem),
        ("cpus-per-task", slurm.cpus_per_task),
    ):
        if value is not None:
            directives.append(f"--{key}={sbatch_value(str(value))}")
    directives += [line.removeprefix("#SBATCH").strip() for line in slurm.extra_sbatch]
    return directives


def _ray_cluster_lines(slurm: SlurmConfig) -> list[str]:
    """Ray over the allocation: the head on the first node, one `ray start` on each other node, a wait until every
    node and GPU has joined, and the cleanup that stops them whatever ends the job."""
    nodes, gpus = slurm.nodes, slurm.gpus_per_node
    return [
        "# The nodes of the allocation; Ray's head runs on the first.",
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        "head=${nodes[0]}",
        "head_ip=$(srun --overlap --nodes=1 --ntasks=1 -w \"$head\" hostname --ip-address | awk '{print $1}')",
        "port=$((20000 + SLURM_JOB_ID % 20000))  # one port per job: jobs may share a node",
        'export RAY_ADDRESS="$head_ip:$port"',
        "cpus=${SLURM_CPUS_ON_NODE:-1}",
        "",
        "# Always stop this job's Ray on every node, whatever ends the job: killing the `ray start --block`",
        "# steps' srun ends them and the Ray processes each started (other jobs' Ray instances are left alone).",
        "cleanup() {",
        '  echo "leap-finetune: stopping Ray (srun reports its steps as cancelled: expected)"',
        "  # SIGKILL to the Ray steps (they keep SIGTERM blocked, see below), on every node, then to their srun",
        '  for step in $(squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -vE "\\.(batch|extern)$"); do',
        '    scancel -s KILL "$step" 2>/dev/null || true',
        "  done",
        "  # a cancelled job's steps take no signal from scancel: this node's step processes are ended directly (the",
        "  # other nodes' at SLURM's KillWait)",
        '  "$PYTHON" -m leap_finetune.launch.slurm stop-steps --job "$SLURM_JOB_ID" || true',
        "  kill -KILL $(jobs -p) 2>/dev/null || true",
        "  wait 2>/dev/null || true",
        "}",
        "trap cleanup EXIT",
        "",
        "# SIGTERM (scancel, the time limit, --signal) reaches every process of the job: the run saves a checkpoint",
        "# and stops. Ray's processes keep SIGTERM blocked (`keep-running`) so that they outlive it until the",
        "# checkpoint is written; this shell passes it on to the run and waits for it.",
        'keep=("$PYTHON" -m leap_finetune.launch.slurm keep-running --)',
        f'srun --overlap --nodes=1 --ntasks=1 -w "$head" "${{keep[@]}}" "$RAY" start --head --node-ip-address="$head_ip" '
        f'--port="$port" --num-cpus="$cpus" --num-gpus={gpus} --temp-dir="$ray_tmp" --include-dashboard=false --block &',
        '"$PYTHON" -m leap_finetune.launch.slurm wait --address "$RAY_ADDRESS" --nodes 1 --gpus 0 '
        f"--timeout {slurm.ray_start_timeout_s}",
        'for node in "${nodes[@]:1}"; do',
        f'  srun --overlap --nodes=1 --ntasks=1 -w "$node" "${{keep[@]}}" "$RAY" start --address="$RAY_ADDRESS" '
        f'--num-cpus="$cpus" --num-gpus={gpus} --block &',
        "done",
        f'"$PYTHON" -m leap_finetune.launch.slurm wait --address "$RAY_ADDRESS" --nodes {nodes} --gpus {nodes * gpus} '
        f"--timeout {slurm.ray_start_timeout_s}",
        "",
    ]


def log_pattern(log_folder: Path) -> str:
    """--output's file name pattern: the job id in the log's name, `%` of the folder's own name kept as it is."""
    folder = str(log_folder)
    if "\\" in folder or one_line(folder) != folder:
        # (sbatch takes a backslash in --output as "no %j patterns": the log would not be where it is announced)
        raise LeapError(
            f"the job's log folder {folder!r} holds a backslash or a control character, which sbatch's "
            "--output would misread",
            where="leap-finetune slurm",
            fix="keep the config (and outputs/) in a folder whose path has neither",
        )
    return folder.replace("%", "%%") + "/slurm-%j.out"


def one_line(text: str) -> str:
    """Text for a comment line of the script: a control character (a newline would end the comment) as `?`."""
    return "".join("?" if ord(char) < 32 or ord(char) == 127 else char for char in text)


def check_job_resources(resolved: ResolvedConfig, devices, where: str) -> None:
    """The workers fit on the Ray cluster the job starts (ray start with the node's CPUs and GPUs only, below)."""
    from leap_finetune.launch.ray_resources import check_for_plan, check_own_ray

    resources = resolved.ray.resources_per_worker if resolved.ray else None
    check_for_plan(resources, devices.use_gpu, where)
    node = {"GPU": float(devices.gpus_per_node)} if devices.use_gpu else {}
    check_own_ray(
        resources,
        devices.use_gpu,
        devices.workers,
        devices.nodes,
        node,
        where,
        "a Ray cluster of its own in the SLURM job",
    )


def write_script(resolved: ResolvedConfig, slurm: SlurmConfig, folder: Path) -> Path:
    from leap_finetune.files import check_writable

    text = script_text(resolved, slurm, folder)
    check_writable(folder, "the slurm folder")
    folder.mkdir(parents=True, exist_ok=True)
    # (the job name may hold anything sbatch accepts; the file name keeps only what needs no quoting)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", slurm.job_name or "").strip("-.") or resolved.project_name
    path = folder / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)
    return path


def sbatch(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("sbatch") is None:
        raise LeapError(
            "sbatch is not installed here (not a SLURM login node?)",
            where="leap-finetune slurm",
            fix="run this where sbatch works, or leave out --submit and copy the script there",
        )
    return subprocess.run(["sbatch", *args], capture_output=True, text=True, timeout=120)


def check_with_sbatch(script: Path) -> None:
    """`sbatch --test-only`: SLURM says whether it would accept the job (partition, account, time,
    resources), without submitting it."""
    result = sbatch("--test-only", str(script))
    if result.returncode != 0:
        lines = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        raise LeapError(
            f"sbatch would reject the job: {lines[-1] if lines else 'exit code ' + str(result.returncode)}",
            where=f"slurm: ({script})",
            fix="correct the slurm: keys (partition, account, time, nodes, "
            "gpus_per_node, extra_sbatch) for this cluster",
        )


def submit(script: Path) -> str:
    result = sbatch("--parsable", str(script))
    if result.returncode != 0:
        raise LeapError(
            f"sbatch refused the job: {result.stderr.strip()}",
            where=str(script),
            fix="correct the slurm: keys for this cluster",
        )
    return result.stdout.strip().split(";")[0]


def wait_for_cluster(address: str, nodes: int, gpus: int, timeout: float) -> int:
    """Inside the job: until `nodes` Ray nodes with `gpus` GPUs in all have joined (exit 0), or timeout."""
    import ray

    deadline = time.monotonic() + timeout
    seen = (0, 0)
    while time.monotonic() < deadline:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
            alive = [n for n in ray.nodes() if n.get("Alive")]
            seen = (len(alive), int(sum(n.get("Resources", {}).get("GPU", 0) for n in alive)))
            ray.shutdown()
            if seen[0] >= nodes and seen[1] >= gpus:
                print(f"ray: {seen[0]} node(s), {seen[1]} GPU(s) joined at {address}", flush=True)
                return 0
        except Exception:  # noqa: BLE001 - not up yet: try again until the deadline
            if ray.is_initialized():
                ray.shutdown()
        time.sleep(2)
    print(
        f"error: after {timeout:.0f} s only {seen[0]} of {nodes} node(s) and {seen[1]} of {gpus} GPU(s) joined "
        f"the Ray cluster at {address}",
        file=sys.stderr,
        flush=True,
    )
    return 1


def keep_running(command: list[str]) -> int:
    """Run `command` (a `ray start --block`) with SIGTERM and SIGINT blocked, in it and every process it starts.

    SLURM sends SIGTERM to every process of a job at once (scancel, the time limit). Ray's daemons and workers
    would end on it - the workers with a Ray stack dump - while the run is still saving its checkpoint (measured
    with Ray 2.60: no checkpoint, a log full of stack dumps). Blocked, not ignored: Ray installs handlers of
    its own, which replace an ignored disposition but not a blocked mask (exec and fork keep the mask). The
    job's cleanup ends these processes with SIGKILL, and SLURM's own SIGKILL after KillWait still ends them."""
    import os
    import signal

    if not command:
        print("keep-running: no command given", file=sys.stderr)
        return 2
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    os.execvp(command[0], command)
    return 127  # (not reached)


def stop_steps(job: str) -> int:
    """SIGKILL every process on this node that a step of SLURM job `job` started (the `ray start --block` steps
    and the Ray processes under them: their environment has the job's SLURM_JOB_ID and a SLURM_STEP_ID, which the
    batch script's own processes lack). After `scancel JOB` the job is completing and SLURM refuses to signal its
    steps; they would hold the node until KillWait's SIGKILL (measured: 12 s after the run had stopped)."""
    import os
    import signal

    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = dict(
                item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item
            )
            if environ.get(b"SLURM_JOB_ID") == job.encode() and environ.get(b"SLURM_STEP_ID", b"").isdigit():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):  # (gone meanwhile, or another user's)
            continue
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["keep-running"]:
        return keep_running(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    parser = argparse.ArgumentParser(prog="python -m leap_finetune.launch.slurm")
    sub = parser.add_subparsers(dest="command", required=True)
    wait = sub.add_parser("wait", help="wait until the Ray cluster has every node and GPU")
    wait.add_argument("--address", required=True)
    wait.add_argument("--nodes", type=int, required=True)
    wait.add_argument("--gpus", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=600)
    sub.add_parser("keep-running", help="run a command with SIGTERM blocked: keep-running -- COMMAND ...")
    stop = sub.add_parser("stop-steps", help="SIGKILL this node's processes of a SLURM job's steps")
    stop.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    if args.command == "stop-steps":
        return stop_steps(args.job)
    return wait_for_cluster(args.address, args.nodes, args.gpus, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
