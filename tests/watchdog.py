"""Time limits for the tests' child processes that scale with the work, not with the wall clock.

A fixed wall-clock timeout fails a healthy run on a loaded machine (the suite took 92 minutes on a busy 2-core
machine, and three runs hit their 1,200 s limits while still training) and waits needlessly long for a hung one.
What tells a hung process from a slow one is whether it still uses the CPU: so a `Watchdog` follows the CPU time
of a process and everything it started (Ray's workers, a training child, data workers) and fails the test when

- they used no CPU for `idle_s` wall seconds (hung: a deadlock, a wait on a dead server), or
- they used more than `cpu_s` CPU seconds (runaway: a loop that never ends; this budget is CPU time, which a
  loaded machine does not stretch).

`LEAP_TEST_IDLE_S` sets the default idle limit (180 s; raise it on a machine so loaded that a process gets no
CPU for minutes).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable

import psutil

IDLE_S = float(os.environ.get("LEAP_TEST_IDLE_S", "180"))


class Hung(AssertionError):
    pass


class Watchdog:
    """The CPU time of the processes `pids()` names and all their descendants, checked by `check()`."""

    def __init__(
        self, pids: int | Callable[[], Iterable[int]], *, what: str, cpu_s: float = 3600, idle_s: float | None = None
    ):
        self._pids = (lambda: [pids]) if isinstance(pids, int) else pids
        self.what, self.cpu_s, self.idle_s = what, cpu_s, IDLE_S if idle_s is None else idle_s
        self._seen: dict[tuple[int, float], float] = {}  # (pid, start time) -> its CPU seconds when last seen
        # what the processes used before: the budget counts from now (a watchdog may follow this very process)
        self._start = self._last_total = self.cpu_seconds()
        self._last_progress = time.monotonic()

    def _processes(self) -> list[psutil.Process]:
        found: dict[int, psutil.Process] = {}
        for pid in self._pids():
            try:
                root = psutil.Process(pid)
                for process in [root, *root.children(recursive=True)]:
                    found[process.pid] = process
            except psutil.Error:
                continue
        return list(found.values())

    def cpu_seconds(self) -> float:
        for process in self._processes():
            try:
                with process.oneshot():
                    times = process.cpu_times()
                    key = (process.pid, process.create_time())
                # its own time only: children_* would count again what its children, seen here too, used
                self._seen[key] = times.user + times.system
            except psutil.Error:
                continue  # gone: what it used stays counted as last seen (a child that lived < 1 s is missed)
        return sum(self._seen.values())

    def check(self) -> None:
        total, now = self.cpu_seconds(), time.monotonic()
        if total > self._last_total + 0.2:
            self._last_total, self._last_progress = total, now
        used = total - self._start
        if used > self.cpu_s:
            raise Hung(f"{self.what} used {used:.0f} CPU seconds, more than its budget of {self.cpu_s:.0f}")
        if now - self._last_progress > self.idle_s:
            raise Hung(
                f"{self.what} used no CPU for {now - self._last_progress:.0f} s (hung?); {used:.0f} CPU seconds in all"
            )


def communicate(
    proc: subprocess.Popen, *, what: str = "the run", cpu_s: float = 3600, idle_s: float | None = None
) -> tuple[str, str]:
    """`proc.communicate()` under a Watchdog: the process is killed and the test fails if it hangs."""
    watchdog = Watchdog(proc.pid, what=what, cpu_s=cpu_s, idle_s=idle_s)
    while True:
        try:
            # a retried communicate() loses no output (subprocess documents it)
            return proc.communicate(timeout=1)
        except subprocess.TimeoutExpired:
            try:
                watchdog.check()
            except Hung as hung:
                _kill_tree(proc.pid)
                try:
                    _, err = proc.communicate(timeout=30)
                except subprocess.TimeoutExpired:  # a grandchild left outside the tree still holds the pipes
                    err = "(its output could not be read: a process it started still holds it)"
                raise Hung(f"{hung} - killed\n--- its stderr, last lines:\n{(err or '')[-3000:]}") from None


def wait_until(
    condition: Callable[[], object], watchdog: Watchdog, *, poll_s: float = 0.05, proc: subprocess.Popen | None = None
) -> object:
    """Polls `condition` until it is true; fails when the watched processes hang or `proc` ends first."""
    last_check = 0.0
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{watchdog.what} ended (exit {proc.returncode}) before the awaited moment")
        if time.monotonic() - last_check > 1:
            watchdog.check()
            last_check = time.monotonic()
        time.sleep(poll_s)


def run(
    args: list[str], *, what: str, cpu_s: float = 3600, idle_s: float | None = None, **popen
) -> subprocess.CompletedProcess:
    """`subprocess.run(args, capture_output=True, text=True)` under a Watchdog."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    out, err = communicate(proc, what=what, cpu_s=cpu_s, idle_s=idle_s)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass


def ray_workers() -> list[int]:
    """Ray Train's worker processes: with an outside Ray instance they are not the driver's descendants."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "RayTrainWorker" in " ".join(process.info["cmdline"] or []):
            found.append(process.pid)
    return found
