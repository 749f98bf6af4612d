"""Servers the driver runs beside training: GRPO's rollout server and judge, started BEFORE Ray or any training
process, and the reserved evaluation server, started by the driver's evaluator (launch/evaluator.py) on each
snapshot; each health-checked within a bounded time, logged to the run folder, and always stopped - at the end,
on an error, on Ctrl-C.

A server runs in its own process session (its workers with it), so stopping it stops the whole group:
SIGTERM, then SIGKILL after a grace period. On Linux it also gets SIGTERM if the driver dies without
cleaning up (PR_SET_PDEATHSIG), so a killed driver does not leave a server holding GPUs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from leap_finetune.errors import LeapError

LOG_TAIL_LINES = 30

# Every process the project starts (Ray workers, evaluation and rollout servers, sbatch jobs) keeps NVLink
# multicast off: on the H200 machines NCCL's NVLS and torch's symmetric-memory multicast hang or fail
# (../shared/ENVIRONMENT.md); the three switches go into each child's environment.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass
class ServerSpec:
    name: str  # "rollout server", "judge", ...
    command: list[str]
    port: int
    health_path: str = "/health"
    env: dict[str, str] = field(default_factory=dict)  # on top of the driver's environment
    host: str = "127.0.0.1"  # where the driver checks the port and health
    start_timeout_s: float = 600


def _libc():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


# Loaded here, not in the child: the child of a multi-threaded process (the reserved evaluation server is started
# from a background thread) must not dlopen between fork and exec (a lock held by another thread deadlocks it).
_LIBC = _libc()


def die_with_parent() -> None:
    """preexec_fn of every long-lived child the driver starts: its own session (a Ctrl-C at the terminal is the
    driver's to handle, not the child's) and SIGTERM when the driver dies (runs in the child, before exec)."""
    os.setsid()
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


class Server:
    def __init__(self, spec: ServerSpec, log_path: Path):
        self.spec = spec
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    def start(self) -> None:
        spec = self.spec
        if port_in_use(spec.host, spec.port):
            raise LeapError(
                f"the {spec.name} cannot start: port {spec.port} is in use by another process",
                where=f"{spec.host}:{spec.port}",
                fix="stop what listens there (e.g. a server left from another run), or choose another "
                "port in the config",
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(spec.command)}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(
                    spec.command,
                    env={**os.environ, **spec.env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=die_with_parent,
                )
            except FileNotFoundError:
                raise LeapError(
                    f"the {spec.name} cannot start: '{spec.command[0]}' is not installed",
                    where=" ".join(spec.command[:3]),
                    fix="install it in this environment (docs/install.md lists the extra that brings it)",
                ) from None

    def wait_healthy(self) -> None:
        """Until the health URL answers 200, the process exits (an error with its log's tail), or the
        start timeout passes (an error; the server is stopped)."""
        spec = self.spec
        deadline = time.monotonic() + spec.start_timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise LeapError(
                    f"the {spec.name} exited with code {code} before answering its health check; "
                    f"the end of its log:\n{self.log_tail()}",
                    where=spec.name,
                    fix="read the log; the command was: " + " ".join(spec.command),
                )
            try:
                with urllib.request.urlopen(self.url + spec.health_path, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise LeapError(
                    f"the {spec.name} did not answer {self.url}{spec.health_path} within "
                    f"{spec.start_timeout_s:g} s; the end of its log:\n{self.log_tail()}",
                    where=spec.name,
                    fix="read the log; a large model may need a longer start timeout "
                    "(grpo_rollout.server_start_timeout_s)",
                )
            time.sleep(0.5)

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join("    " + line for line in lines[-LOG_TAIL_LINES:])

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM to the server's process group, SIGKILL after `grace_s`; waits until it is gone."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@contextlib.contextmanager
def running(specs: list[ServerSpec], log_dir: Path, console=None):
    """Start every server, wait until each is healthy, yield them; stop them all on the way out, whatever
    ends the block (its end, an error, KeyboardInterrupt)."""
    servers = [Server(spec, log_dir / f"{spec.name.replace(' ', '_')}.log") for spec in specs]
    try:
        for server in servers:
            if console is not None:
                console.print(f"{server.spec.name}: starting ({' '.join(server.spec.command)}); log: {server.log_path}")
            server.start()
        for server in servers:
            server.wait_healthy()
            if console is not None:
                console.print(f"{server.spec.name}: ready at {server.url}")
        yield servers
    finally:
        for server in servers:
            server.stop()
