"""The CLI in a process of its own, for the tests that signal or kill it at a chosen point, without paying its imports
for every process.

A fresh `python -m leap_finetune.cli` spends ~6 s of CPU importing torch, transformers and TRL before it does
anything; the fault tests start a dozen of them, on a suite that is CPU-bound on 2 cores. Here a multiprocessing
forkserver (one per test process, started at the first call) imports them once, and each run is a fork of it that
calls the console script's entry point (`leap_finetune.cli.main`) with its own arguments, environment, working
folder, stdout/stderr and, when asked, its own session - a process of its own that the test signals, kills, pauses
and waits for like any other. What it does not repeat is the interpreter's start-up: the console script as a user
starts it is run by tests/e2e/test_cli.py (the quickstart, validate's exit codes).

`start_cli(...)` returns a `CliProcess`, which answers what the tests ask of a `subprocess.Popen`: `pid`,
`returncode`, `poll()`, `wait()`, `communicate()`, `send_signal()`, `kill()`, `terminate()` (so tests/watchdog.py's
`communicate` and `Watchdog` follow it as they follow a Popen).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

# imported once by the forkserver: what a training run of the CLI imports (the rest is cheap)
PRELOAD = [
    "leap_finetune.cli",
    "leap_finetune.api",
    "leap_finetune.validate.loader",
    "leap_finetune.launch.training",
    "leap_finetune.recipes.sft",
    "leap_finetune.data.prepare",
    "transformers.models.lfm2.modeling_lfm2",
]

_context = None
_started: list[CliProcess] = []


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        atexit.register(_kill_leftovers)  # (before multiprocessing's own exit handler joins them)
    return _context


def _kill_leftovers() -> None:
    """A test that failed half-way may leave its CLI paused or running: it must not keep the test process from
    exiting (multiprocessing joins its children at exit)."""
    for process in _started:
        if process.poll() is None:
            process.kill()


def _run(args: list[str], cwd: str, env: dict, out: str, err: str, new_session: bool) -> None:
    """In the forked process: the console script's entry point, as `python -m leap_finetune.cli ARGS` runs it."""
    if new_session:
        os.setsid()
    # what a fresh interpreter is: the main process, the platform's start method (a forkserver's child inherits
    # "forkserver", and its data-loader workers would then be started by the forkserver, outside its process group)
    me = multiprocessing.current_process()
    me.name, me._identity, me._parent_pid = "MainProcess", (), None
    multiprocessing.process._parent_process = None
    multiprocessing.set_start_method("fork", force=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = [sys.executable, *args]
    from leap_finetune.cli import main

    main(list(args))  # (SystemExit's code becomes the exit code, as for `python -m`)


class CliProcess:
    """A running `leap-finetune ARGS` (see the module's docstring)."""

    def __init__(self, args: list[str], cwd: Path, env: dict, new_session: bool):
        self.args = ["leap-finetune", *args]
        folder = Path(tempfile.mkdtemp(prefix="leap-cli-"))
        self._out, self._err = folder / "stdout", folder / "stderr"
        for path in (self._out, self._err):
            path.touch()  # (read even when the process could not open them)
        self._process = _forkserver().Process(
            target=_run, args=(list(args), str(cwd), dict(env), str(self._out), str(self._err), new_session)
        )
        self._process.start()
        self.pid = self._process.pid
        _started.append(self)

    @property
    def returncode(self) -> int | None:
        """As a Popen's: the exit code, or minus the signal that ended it; None while it runs."""
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """(stdout, stderr) once it has ended; subprocess.TimeoutExpired while it runs (asked again, nothing lost)."""
        self.wait(timeout)
        return self._out.read_text(errors="replace"), self._err.read_text(errors="replace")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def start_cli(
    *args: str, cwd: Path, env: dict | None = None, fault: str | None = None, new_session: bool = False
) -> CliProcess:
    """`leap-finetune ARGS` in `cwd`, in a process of its own; `env` (default: this process's, offline, with the
    warnings users see), `fault`: LEAP_FINETUNE_FAULT (leap_finetune/faults.py), `new_session`: its own session and
    process group (as a job's processes: the test can signal the whole group)."""
    env = dict(os.environ if env is None else env)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "COLUMNS": "200"})
    env.pop("LEAP_FINETUNE_SHOW_WARNINGS", None)
    if fault:
        env["LEAP_FINETUNE_FAULT"] = fault
    return CliProcess(list(args), cwd, env, new_session)
