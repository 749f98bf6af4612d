"""async_eval mode `reserved`: an evaluation server on GPUs the driver kept out of training - respawned on each
snapshot (`weight_reload: respawn`), or started once and handed each new snapshot's weights (`in_place`) - and
`leap-finetune eval --server` against it (run by the driver, launch/evaluator.py, on the snapshots rank 0 hands
over)."""

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
    """vLLM serves the snapshots where it is installed and the evaluation has GPUs (both weight_reload modes);
    otherwise leap-finetune's own server (evaluation/serve.py)."""
    import importlib.util

    return resolved.async_eval.vllm_gpus > 0 and importlib.util.find_spec("vllm") is not None


# `in_place` reloads through vLLM's developer endpoints, which its OpenAI server exposes only with this set
# (POST /collective_rpc, /reset_prefix_cache); the server listens on 127.0.0.1 alone.
VLLM_DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


class ReservedServer:
    """For each snapshot: the evaluation server (vLLM where installed, else evaluation/serve.py: batched
    generation as in sync mode) runs it on the reserved GPUs and `leap-finetune eval --server` runs against it (its
    log-prob benchmarks on the same GPUs). `weight_reload: respawn`: a server started on each snapshot and stopped
    after it. `in_place`: the server started on the first snapshot and kept; each later snapshot's weights are
    loaded into it - no process start, no model load on the GPU from scratch (measured ~20 s per evaluation on an
    H200 for respawn). The reload speaks vLLM's API (POST /collective_rpc reload_weights, then /reset_prefix_cache:
    vLLM would otherwise answer a benchmark's repeated prompts from the KV cache of the previous weights), which
    evaluation/serve.py answers too. A server that died or refused a reload is started again on that snapshot.
    `close()` stops it at the end of training."""

    def __init__(self, resolved: ResolvedConfig, run_dir: Path):
        self.devices = resolved.eval_devices or ""  # physical ids, decided by the driver ("" on CPU)
        self.in_place = resolved.async_eval.reserved.weight_reload == "in_place"
        self.kept = None  # the in_place server, between snapshots
        self.tied = None  # whether the kept server's model ties its output head to the embeddings
        self.started = 0  # servers started so far

    def server_command(self, resolved: ResolvedConfig, model: Path, port: int) -> list[str]:
        from leap_finetune.evaluation.server import vllm_server_flags

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
                *vllm_server_flags(resolved),
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
        """The snapshot evaluated: its weights handed to the kept server (in_place), else a server started on it;
        then `leap-finetune eval --server` against that server."""
        from leap_finetune.runs.processes import Server

        settings = resolved.async_eval
        model = snapshot.folder / MODEL
        server_log = jobs / ("server.log" if self.in_place else f"step-{snapshot.step}-server.log")
        server = self._kept_with(model, snapshot.step, settings.reserved.start_timeout_s, stop)
        if server is not None and stop.is_set():
            return Outcome(reason="stopped (training ended)", log=server_log)
        fresh = server is None
        if fresh:
            if self.in_place and self.started:  # (the one before exited or failed: said in the run's log)
                print(f"leap-finetune: starting the evaluation server again for step {snapshot.step}", file=sys.stderr)
            self.started += 1
            server = Server(self._spec(resolved, model), server_log)
        try:
            if fresh:
                try:
                    server.start()
                    server.wait_healthy()
                except LeapError as err:
                    said = err.message.splitlines()[0].removeprefix("the evaluation server ")
                    return Outcome(reason=f"the evaluation server {said}", log=server_log)
                self.kept = server if self.in_place else None
                self.tied = _tied(model)
            return self._evaluate(resolved, snapshot, server, jobs / f"step-{snapshot.step}.log", server_log, stop)
        finally:
            if server is not self.kept:
                server.stop()

    def _environment(self, resolved: ResolvedConfig) -> dict[str, str]:
        """The server's and the evaluation's: the reserved GPUs; on CPU one thread each (the cores stay with
        training)."""
        env = {"CUDA_VISIBLE_DEVICES": self.devices, **NO_MULTICAST}
        if self.in_place and use_vllm(resolved):
            env.update(VLLM_DEV_MODE)
        if not resolved.async_eval.vllm_gpus:
            env["OMP_NUM_THREADS"] = "1"
        return env

    def _spec(self, resolved: ResolvedConfig, model: Path):
        from leap_finetune.runs.processes import ServerSpec

        settings = resolved.async_eval
        port = settings.reserved.server_port
        return ServerSpec(
            name="evaluation server",
            port=port,
            env=self._environment(resolved),
            start_timeout_s=settings.reserved.start_timeout_s,
            command=_niced(resolved) + self.server_command(resolved, model, port),
        )

    def _kept_with(self, model: Path, step: int, timeout_s: float, stop: threading.Event):
        """The in_place server holding `model`'s weights now, or None (a new server gets the snapshot). Kept as it
        is when training ended during the reload (`stop`: close() stops it)."""
        server = self.kept if self.in_place else None
        if server is not None and _tied(model) != self.tied:
            # a LoRA run's adapter moved the tied embeddings and output head apart (evaluation/snapshot.py saves them
            # untied): a served model built tied cannot hold them - vLLM's reload would keep one of the two
            print(
                f"leap-finetune: step {step}'s model has its own output head (no longer tied to the "
                "embeddings): starting the evaluation server again",
                file=sys.stderr,
            )
            server.stop()
            server = self.kept = None
        if server is None:
            return None
        reloaded = self._reload(server, model, timeout_s, stop)
        if reloaded is not True and not stop.is_set():  # (its reason is in the server's log; a fresh server follows)
            print(f"leap-finetune: {reloaded}: starting the evaluation server again", file=sys.stderr)
            server.stop()
            server = self.kept = None
        return server

    def _evaluate(self, resolved, snapshot: Snapshot, server, log: Path, server_log: Path, stop) -> Outcome:
        """`leap-finetune eval --server` on the snapshot's eval.yaml, its results or why there are none."""
        started = time.monotonic()  # (the evaluation's own time: the server's start left out)
        command = _niced(resolved) + [
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
                env={**os.environ, **self._environment(resolved)},
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
            results = json.loads(results.read_text(encoding="utf-8"))["results"]
            return Outcome(results=results, log=log, seconds=time.monotonic() - started)
        if self.kept is server:  # (a kept server that failed an evaluation is not trusted with the next one)
            self.kept = None
        if server.process.poll() is not None:  # (the client's own advice - start a server - is not the user's)
            return Outcome(
                reason=f"the evaluation server exited (code {server.process.returncode}) during the evaluation; "
                f"its log: {server_log}" + ("; a new one is started for the next snapshot" if self.in_place else ""),
                log=server_log,
            )
        return Outcome(reason=f"leap-finetune eval exited with code {client.returncode}: {_last_line(log)}", log=log)

    def _reload(self, server, model: Path, timeout_s: float, stop: threading.Event) -> bool | str:
        """True when the kept server took `model`'s weights; otherwise why not. The request runs beside a loop that
        gives up when training ends (`stop`), the server exits, or `timeout_s` (reserved.start_timeout_s) passes."""
        if server.process is None or server.process.poll() is not None:
            return "the evaluation server had exited"
        answer: dict = {}
        request = threading.Thread(target=_post_reload, args=(server.url, model, timeout_s, answer), daemon=True)
        request.start()
        deadline = time.monotonic() + timeout_s
        while request.is_alive():
            if stop.is_set():
                return "stopped (training ended)"
            if server.process.poll() is not None:
                return f"the evaluation server exited while loading the weights of {model}"
            if time.monotonic() > deadline:
                return f"the evaluation server did not load the weights of {model} within {timeout_s:g} s"
            request.join(POLL_S / 2)
        if "error" in answer:
            return answer["error"]
        return True

    def close(self) -> None:
        """The in_place server stopped (the end of training)."""
        if self.kept is not None:
            self.kept.stop()
            self.kept = None


def _niced(resolved: ResolvedConfig) -> list[str]:
    """A CPU evaluator's processes run at the lowest priority: the cores stay with training."""
    return ["nice", "-n", "19"] if not resolved.async_eval.vllm_gpus else []


def _post_reload(url: str, model: Path, timeout_s: float, answer: dict) -> None:
    """The served weights replaced by `model`'s, the way vLLM's OpenAI server takes it (its worker's
    reload_weights(weights_path=...), then the prefix cache emptied); evaluation/serve.py answers the same two
    requests. `answer["error"]` says what went wrong (the server's own words where it gave some)."""
    error = _post(
        f"{url}/collective_rpc",
        {"method": "reload_weights", "kwargs": {"weights_path": str(model)}, "timeout": timeout_s},
        timeout_s,
    )
    if error is not None and error.startswith("404"):
        answer["error"] = (
            f"the evaluation server has no POST /collective_rpc to load the weights of {model} into ({error}): vLLM "
            "serves it only with VLLM_SERVER_DEV_MODE=1 (set by leap-finetune) and in versions that have it (0.26.0 "
            "is tested); use weight_reload: respawn with another vLLM"
        )
    elif error is not None:
        answer["error"] = (
            f"the evaluation server refused the weights of {model} ({error})"
            if error[:1].isdigit()
            else f"the evaluation server did not load the weights of {model}: {error}"
        )
    else:
        error = _post(f"{url}/reset_prefix_cache", None, timeout_s)
        if error is not None:  # (the new weights are in, the old ones' cached keys and values maybe not gone)
            answer["error"] = (
                f"the evaluation server loaded the weights of {model} but did not empty its cache: {error}"
            )


def _post(url: str, body: dict | None, timeout_s: float) -> str | None:
    """None when the server answered 2xx; otherwise 'CODE: detail' for an HTTP error, or the connection's error."""
    import http.client
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            reply.read()
        return None
    except urllib.error.HTTPError as err:
        try:
            detail = _said(json.loads(err.read()))
        except (ValueError, OSError):
            detail = None
        return f"{err.code}: {detail or err.reason}"
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"


def _said(body) -> str | None:
    """The message of an error body: FastAPI's {"detail": text or [{"msg": ...}]}, OpenAI's and vLLM's
    {"error": {"message": ...}} or {"message": ...}."""
    if isinstance(body, dict):
        for key in ("detail", "error", "message", "msg"):
            if body.get(key):
                return _said(body[key])
        return None
    if isinstance(body, list):
        return "; ".join(filter(None, (_said(item) for item in body))) or None
    return str(body)


def _tied(model: Path) -> bool | None:
    """config.json's tie_word_embeddings (a vision-language model's text_config's), None when it is not said."""
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    return config.get("tie_word_embeddings", text.get("tie_word_embeddings"))


def _last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"
