"""The servers the driver runs beside training (runs/processes.py), against real processes (Python's HTTP
server; tests/e2e/test_grpo.py runs a real `transformers serve` as a judge): a server that exits early,
one that never becomes healthy, a port in use, and teardown on errors and Ctrl-C."""

from __future__ import annotations

import socket
import sys
import urllib.request

import psutil
import pytest

from leap_finetune.errors import LeapError
from leap_finetune.runs.processes import ServerSpec, port_in_use, running


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_that_exits_early_is_an_error_with_its_log(tmp_path):
    port = _free_port()
    spec = ServerSpec(
        "rollout server",
        [sys.executable, "-c", "print('unknown flag --tensor-parallel'); exit(3)"],
        port=port,
        start_timeout_s=30,
    )
    with pytest.raises(LeapError) as info:
        with running([spec], tmp_path):
            pass
    message = info.value.format()
    assert "the rollout server exited with code 3 before answering its health check" in message
    assert "unknown flag --tensor-parallel" in message


def test_a_server_that_never_becomes_healthy_times_out_and_is_stopped(tmp_path):
    port = _free_port()
    # a real HTTP server whose /health is a 404
    spec = ServerSpec(
        "judge", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port=port, start_timeout_s=4
    )
    before = {p.pid for p in psutil.process_iter()}
    with pytest.raises(LeapError) as info:
        with running([spec], tmp_path):
            pass
    assert "did not answer" in info.value.format() and "within 4 s" in info.value.format()
    started = [
        p
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before and "http.server" in " ".join(p.info["cmdline"] or [])
    ]
    assert all(_gone(p.pid) for p in started)
    assert not port_in_use("127.0.0.1", port)


def test_a_port_in_use_is_an_error_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spec = ServerSpec("rollout server", [sys.executable, "-c", "import time; time.sleep(60)"], port=port)
        with pytest.raises(LeapError) as info:
            with running([spec], tmp_path):
                pass
    assert f"port {port} is in use" in info.value.format()
    assert not (tmp_path / "rollout_server.log").exists()


@pytest.mark.parametrize("ending", [RuntimeError("training failed"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_servers_are_stopped_when_training_fails_or_is_interrupted(tmp_path, ending):
    """Also the normal path: the server answers (health), logs its command, and is gone afterwards."""
    port = _free_port()
    spec = ServerSpec(
        "judge", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port=port, health_path="/"
    )
    with pytest.raises(type(ending)):
        with running([spec], tmp_path) as [server]:
            pid = server.process.pid
            with urllib.request.urlopen(server.url + "/", timeout=10) as answer:
                assert answer.status == 200
            raise ending
    assert _gone(pid) and not port_in_use("127.0.0.1", port)
    assert (tmp_path / "judge.log").read_text().startswith("$ ")
