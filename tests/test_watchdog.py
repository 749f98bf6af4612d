"""The tests' own time limits (tests/watchdog.py): a hung process fails its test quickly; a slow one that still
works does not fail."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.watchdog import Hung, communicate, run


def test_a_process_that_uses_no_cpu_is_killed_as_hung():
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with pytest.raises(Hung, match="used no CPU for"):
        communicate(proc, what="the sleeper", idle_s=3)
    assert proc.poll() is not None and time.monotonic() - started < 30


def test_a_busy_child_counts_and_its_cpu_budget_ends_a_runaway():
    # the CPU is used by a grandchild: the budget follows everything the process started
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
    with pytest.raises(Hung, match="more than its budget of 2"):
        run([sys.executable, "-c", code], what="the spinner", cpu_s=2, idle_s=60)


def test_a_slow_process_that_works_finishes():
    # ~2.5 s of pure CPU with an idle limit of 2 s: never idle, so never killed
    code = "import time\nend = time.process_time() + 2.5\nwhile time.process_time() < end: pass\nprint('done')"
    result = run([sys.executable, "-c", code], what="the worker", idle_s=2)
    assert result.returncode == 0 and result.stdout == "done\n"


def test_the_budget_counts_from_the_watchdogs_start():
    import os

    from tests.watchdog import Watchdog

    end = time.process_time() + 0.5
    while time.process_time() < end:  # this process has used > 0.5 CPU seconds before the watchdog starts
        pass
    watchdog = Watchdog(os.getpid(), what="this test", cpu_s=0.4)
    watchdog.check()  # nothing used since
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
    with pytest.raises(Hung, match="more than its budget"):
        watchdog.check()
