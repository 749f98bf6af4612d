"""What a killed driver's local Ray instance leaves is stopped: by the driver's watcher when the driver goes (the
SIGKILL path: tests/e2e/test_distributed.py), else by the next local instance started here, which says what it
stopped. Real processes: a stand-in of the session's agents (named by its session folder, as Ray's are by their open
log files), a driver that has ended."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

from leap_finetune.launch import ray_reaper


def test_the_next_local_instance_stops_what_a_killed_runs_session_left_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_reaper, "registry", lambda: tmp_path / "registry")
    session = str(tmp_path / "session_2026-12-05_07-00-00_000000_4242")
    sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
    # (a stand-in of Ray's log monitor, named as Ray starts it; a `tail` of the session's log is not Ray's)
    agent = subprocess.Popen([*sleep, "/venv/lib/ray/_private/log_monitor.py", f"--session-dir={session}"])
    bystander = subprocess.Popen([*sleep, f"{session}/logs/raylet.out"])
    driver = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(driver.pid).create_time() if psutil.pid_exists(driver.pid) else time.time()
    driver.wait()
    (tmp_path / "registry").mkdir()
    record = tmp_path / "registry" / f"{driver.pid}-session.json"
    record.write_text(json.dumps({"driver": driver.pid, "driver_started": started, "session": session}))
    # a live driver's instance is left alone
    live = tmp_path / "registry" / "live.json"
    me = psutil.Process()
    live.write_text(
        json.dumps({"driver": me.pid, "driver_started": me.create_time(), "session": str(tmp_path / "session_live_1")})
    )
    # a record naming no Ray session (`/` would match every process) is dropped, never acted on
    planted = tmp_path / "registry" / "planted.json"
    planted.write_text(json.dumps({"driver": driver.pid, "driver_started": started, "session": "/"}))
    try:
        [said] = ray_reaper.reap_left_over()
        assert f"(pid {driver.pid}) was killed" in said and f"({agent.pid})" in said, said
        assert agent.wait(timeout=10) is not None  # (stopped)
        assert bystander.poll() is None and not record.exists() and live.exists() and not planted.exists()
        assert ray_reaper.reap_left_over() == []  # (said once)
    finally:
        for process in (agent, bystander):
            process.kill()
            process.wait()
