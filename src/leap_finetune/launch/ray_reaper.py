"""A local Ray instance dies with the driver that started it, however the driver ends.

`ray.shutdown()` stops the instance when the driver ends normally or by a signal it can handle. A SIGKILLed driver
cannot: Ray's GCS and raylet then stop on their own, but their agents (`ray::DashboardAgent`,
`ray::RuntimeEnvAgent`) outlive them, orphaned, for good (measured with Ray 2.60: they wait on the dead GCS to flush
their logs). So the driver starts a small watcher with the instance (`python -m leap_finetune.launch.ray_reaper`, in
a session of its own: a signal to the driver's process group does not reach it): it waits for the driver to go, then
stops every process of the instance's session. Should the watcher itself be killed too, the next local Ray
instance started here stops what the earlier session left, and says so (`reap_left_over`).

A process belongs to a session when it holds a file under the session's folder open (Ray's processes write their
logs there), or names the folder on its command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLL_S = 0.5
RAY_NAMES = ("ray::", "raylet", "gcs_server")


def registry() -> Path:
    """One file per local Ray instance started by a driver here: {driver, driver_started, session}."""
    return Path(tempfile.gettempdir()) / f"leap-finetune-ray-{os.getuid()}"


def watch(session_dir: str) -> None:
    """Record this driver's instance and start its watcher (called right after ray.init of a local instance)."""
    import psutil

    folder = registry()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _ours(folder):
            return  # (a folder another user made: its records are not trusted, none is written there)
        me = psutil.Process()
        entry = {"driver": me.pid, "driver_started": me.create_time(), "session": session_dir}
        record = folder / f"{me.pid}-{Path(session_dir).name}.json"
        record.write_text(json.dumps(entry))
    except OSError:
        return  # (a full or read-only temp folder: the run goes on; ray.shutdown still stops the instance)
    subprocess.Popen(
        [sys.executable, "-m", "leap_finetune.launch.ray_reaper", str(record)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )


def reap_left_over() -> list[str]:
    """Stop the processes of earlier local instances whose driver is gone (its watcher killed too); what was stopped,
    as lines to print."""
    folder = registry()
    said = []
    for record in sorted(folder.glob("*.json")) if folder.is_dir() and _ours(folder) else []:
        try:
            entry = json.loads(record.read_text())
            valid = _is_session(entry["session"]) and isinstance(entry["driver"], int)
        except (OSError, ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            record.unlink(missing_ok=True)
            continue
        if _alive(entry):
            continue
        stopped = stop_session(entry["session"])
        record.unlink(missing_ok=True)
        if stopped:
            said.append(
                f"stopped {len(stopped)} process(es) an earlier run's local Ray instance left when its driver "
                f"(pid {entry['driver']}) was killed: {', '.join(stopped)}"
            )
    return said


def _ours(folder: Path) -> bool:
    """The registry is this user's alone: owned by them, writable by no one else."""
    try:
        stat = folder.stat()
    except OSError:
        return False
    return stat.st_uid == os.getuid() and not stat.st_mode & 0o022


def _is_session(session) -> bool:
    """A Ray session folder as ray.init names it: absolute, `session_...` (never `/` or a home folder)."""
    return isinstance(session, str) and os.path.isabs(session) and Path(session).name.startswith("session_")


def _alive(entry: dict) -> bool:
    import psutil

    try:
        process = psutil.Process(entry["driver"])
        return abs(process.create_time() - entry["driver_started"]) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def stop_session(session: str) -> list[str]:
    """SIGTERM, then SIGKILL after 3 s, every process of the Ray session `session`; their names and pids."""
    import psutil

    if not _is_session(session):
        return []
    found = [p for p in psutil.process_iter(["pid", "name", "cmdline"]) if _in_session(p, session)]
    for process in found:
        _send(process, signal.SIGTERM)
    gone, alive = psutil.wait_procs(found, timeout=3)
    for process in alive:
        _send(process, signal.SIGKILL)
    return [f"{p.info['name']} ({p.pid})" for p in found]


def _in_session(process, session: str) -> bool:
    import psutil

    if process.pid == os.getpid():
        return False
    name = process.info.get("name") or ""
    command = process.info.get("cmdline") or []
    inside = session.rstrip("/") + "/"
    # Ray's own processes only: its native ones and agents by name, its Python ones (dashboard, log monitor,
    # autoscaler monitor) by a ray module on the command line naming the session - never a `tail -f` of its logs
    if not name.startswith(RAY_NAMES) and not any("/ray/" in part and part.endswith(".py") for part in command):
        return False
    if any(part == session or part.startswith(inside) or f"={inside}" in part or part.endswith(f"={session}")
           for part in command):  # fmt: skip
        return True
    try:
        return any(f.path.startswith(inside) for f in process.open_files())
    except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
        return False


def _send(process, signum: int) -> None:
    import psutil

    try:
        process.send_signal(signum)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass


def main(argv: list[str]) -> None:
    """The watcher: wait for the driver, then stop its instance's session."""
    record = Path(argv[0])
    entry = json.loads(record.read_text())
    while _alive(entry):
        time.sleep(POLL_S)
    stop_session(entry["session"])
    record.unlink(missing_ok=True)


if __name__ == "__main__":
    main(sys.argv[1:])
