"""async_eval mode `reserved`: an evaluation server respawned on each snapshot on GPUs the driver kept out of
training, and `leap-finetune eval --server` against it (run by the driver, launch/evaluator.py, on the snapshots
rank 0 hands over)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.errors import LeapError
from leap_finetune.evaluation.snapshot import Outcome, Snapshot
from leap_finetune.runs.folder import MODEL
from leap_finetune.runs.processes import NO_MULTICAST, die_with_parent

POLL_S = 1.0


def use_vllm(resolved: ResolvedConfig) -> bool:
    import importlib.util

    return resolved.async_eval.vllm_gpus > 0 and importlib.util.find_spec("vllm") is not None


class ReservedServer:
    """For each snapshot: the evaluation server (vLLM where installed, else evaluation/serve.py: batched
    generation as in sync mode) is (re)started on it (`weight_reload: respawn`) on the reserved GPUs,
    `leap-finetune eval --server` runs against it (its log-prob benchmarks on the same GPUs), and the server is
    stopped."""

    def __init__(self, resolved: ResolvedConfig, run_dir: Path):
        self.devices = resolved.eval_devices or ""  # physical ids, decided by the driver ("" on CPU)

    def server_command(self, resolved: ResolvedConfig, model: Path, port: int) -> list[str]:
        from leap_finetune.evaluation.server import vllm_tool_flags

        settings = resolved.async_eval
        if use_vllm(resolved):
            return [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--tensor-parallel-size",
                str(settings.tensor_parallel_size),
                "--gpu-memory-utilization",
                str(settings.gpu_memory_utilization),
                "--served-model-name",
                "snapshot",
                *vllm_tool_flags(resolved),
            ]
        return [
            sys.executable,
            "-m",
            "leap_finetune.evaluation.serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cuda" if settings.vllm_gpus else "cpu",
            "--batch-size",
            str(resolved.evals.batch_size),
        ]

    def __call__(self, resolved: ResolvedConfig, snapshot: Snapshot, jobs: Path, stop: threading.Event) -> Outcome:
        from leap_finetune.runs.processes import Server, ServerSpec

        settings = resolved.async_eval
        port = settings.reserved.server_port
        env = {"CUDA_VISIBLE_DEVICES": self.devices, **NO_MULTICAST}
        cpu = not settings.vllm_gpus
        if cpu:  # a CPU evaluator: one thread each, at the lowest priority - the cores stay with training
            env["OMP_NUM_THREADS"] = "1"
        spec = ServerSpec(
            name="evaluation server",
            port=port,
            env=env,
            start_timeout_s=settings.reserved.start_timeout_s,
            command=(["nice", "-n", "19"] if cpu else [])
            + self.server_command(resolved, snapshot.folder / MODEL, port),
        )
        server_log = jobs / f"step-{snapshot.step}-server.log"
        server = Server(spec, server_log)
        try:
            try:
                server.start()
                server.wait_healthy()
            except LeapError as err:
                said = err.message.splitlines()[0].removeprefix("the evaluation server ")
                return Outcome(reason=f"the evaluation server {said}", log=server_log)
            log = jobs / f"step-{snapshot.step}.log"
            command = (["nice", "-n", "19"] if cpu else []) + [
                sys.executable,
                "-m",
                "leap_finetune.cli",
                "eval",
                str(snapshot.folder / "eval.yaml"),
                "--server",
                f"{server.url}/v1",
                "--output",
                str(snapshot.folder / "results.json"),
            ]
            if use_vllm(resolved):
                command += ["--server-model", "snapshot"]
            with log.open("ab") as handle:
                client = subprocess.Popen(
                    command,
                    env={**os.environ, **env},
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=die_with_parent,  # (the driver's Ctrl-C stops training first, not the evaluation)
                )
                while client.poll() is None:
                    if stop.is_set():
                        client.kill()
                        client.wait()
                        return Outcome(reason="stopped (training ended)", log=log)
                    time.sleep(POLL_S / 2)
            results = snapshot.folder / "results.json"
            if client.returncode == 0 and results.exists():
                return Outcome(results=json.loads(results.read_text(encoding="utf-8"))["results"], log=log)
            alive = "" if server.process.poll() is None else f"; the server had exited (log: {server_log})"
            return Outcome(
                reason=f"leap-finetune eval exited with code {client.returncode}{alive}: {_last_line(log)}", log=log
            )
        finally:
            server.stop()


def _last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"
