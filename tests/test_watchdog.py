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


def test_a_hung_test_fails_with_every_threads_stack_and_the_suite_goes_on(request, tmp_path):
    """The suite's per-test limit (pytest-timeout, set in pyproject.toml): a test that hangs fails with where each
    thread was, and the next test still runs. Here with the project's settings and a 2 s limit."""
    assert float(request.config.getini("timeout")) >= 300  # (far above the slowest test: a loaded machine passes)
    assert request.config.getini("timeout_method") == "signal"  # (fails the test; "thread" would end the suite)
    (tmp_path / "test_hang.py").write_text(
        "import threading, time\n"
        "def test_hangs():\n"
        "    threading.Thread(target=time.sleep, args=(60,), name='helper', daemon=True).start()\n"
        "    threading.Event().wait()\n"
        "def test_next():\n"
        "    pass\n"
    )
    pyproject = request.config.rootpath / "pyproject.toml"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(pyproject), "-o", "timeout=2", "-p", "no:cacheprovider", "-q"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_hang.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and time.monotonic() - started < 60, done.stdout[-3000:]
    assert "Timeout (>2.0s) from pytest-timeout" in done.stdout and "1 failed, 1 passed" in done.stdout, done.stdout[
        -3000:
    ]
    assert "helper" in done.stdout and "threading.Event().wait()" in done.stdout  # (each thread's stack)
