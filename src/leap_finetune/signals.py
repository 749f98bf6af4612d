"""Ctrl-C and SIGTERM, in every phase of a run and in every process that trains.

A run answers a stop request the same way wherever it is (in-process, the one-GPU training child, Ray
workers, a SLURM job), according to what it is doing when the signal arrives:

- before training (data, model loading): the run stops at once (`Stopped`); a new run folder without a
  checkpoint is removed by the driver, so nothing half-made is left to block a re-run;
- while training: the first signal finishes the current step, saves a complete checkpoint and stops; a second
  one (not the same signal delivered twice within 2 s: SLURM, systemd and the driver signal every process of a
  job) stops at once;
- after training (final evaluation, saving the model): the first signal is noted and the run finishes, since
  the end is the quickest safe place to stop; a second stops at once (the final checkpoint is intact, and a
  resume from it only finishes the run).

Ray's workers never see the driver's signals (their process group is not the terminal's, and Ray's daemons
block SIGINT): the driver writes STOP_REQUEST in the run folder, rank 0 reads it after every step, and the
ranks agree through one all-reduce, so that every rank saves the same step (recipes/callbacks.py). The driver is
in the training phase once the workers start: a first signal while they load the model stops them after their
first step, with a checkpoint.

Python installs handlers only in the main thread: where a run is started from another thread, the defaults
apply (Ctrl-C raises KeyboardInterrupt, SIGTERM ends the process).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_REQUEST = ".leap-stop-request"  # in the run folder: the driver asks Ray workers to checkpoint and stop
SAME_EVENT_S = 2.0


def _libc():

    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


# Loaded in the parent, at import: a forked child must not dlopen (a lock held by another thread of the parent
# at the fork would deadlock it).
_LIBC = _libc()


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal outside the training loop (or a second signal inside it)."""

    def __init__(self, signum: int, when: str, at_once: bool = False):
        self.signum = signum
        self.when = when
        self.at_once = at_once  # a second signal: the process ends without waiting for anything
        self.note = ""  # what the stop left (the driver adds it)
        super().__init__(f"stopped by {name(signum)} {when}".strip())

    def message(self) -> str:
        return f"stopped by {name(self.signum)} {self.when}".strip() + (f": {self.note}" if self.note else "")


def name(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name
    except (ValueError, TypeError):
        return f"signal {signum}"


class _State:
    def __init__(self):
        self.phase = "starting"  # starting | training | finishing
        self.received: int | None = None  # the first signal of the training or finishing phase
        self.received_at = 0.0
        self.on_first = None  # extra action on the first signal while training (the Ray driver's request file)
        self.installed = False
        self.owner: int | None = None  # the thread whose run installed the handlers (the main thread)
        self.previous: dict = {}


_state = _State()


def _say(text: str) -> None:
    """Straight to the terminal: a signal handler must not take a lock the interrupted code may hold (print goes
    through train.log's tee and its lock: measured, a handler printing there froze the run)."""
    import os

    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


def _handle(signum, frame) -> None:
    now = time.monotonic()
    if _state.received is not None:
        if signum == _state.received and now - _state.received_at < SAME_EVENT_S:
            return  # one event delivered twice
        raise Stopped(signum, "(a second signal: at once)", at_once=True)
    if _state.phase == "starting":
        raise Stopped(signum, "before training started")
    _state.received, _state.received_at = signum, now
    if _state.phase == "training":
        _say(
            f"\n{name(signum)} received: saving a checkpoint after this step, then stopping "
            "(send it again to stop at once)\n"
        )
        if _state.on_first is not None:
            _state.on_first(signum)
    else:
        _say(
            f"\n{name(signum)} received: training is over, finishing the final evaluation and saving the model "
            "(send it again to stop at once; the last checkpoint is intact)\n"
        )


@contextmanager
def handled():
    """Install the handlers for the duration of a run (main thread only; nested uses are no-ops). Restores
    the previous handlers and state afterwards."""
    if _state.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    _state.installed, _state.owner = True, threading.get_ident()
    _state.phase, _state.received, _state.on_first = "starting", None, None
    _state.previous = {s: signal.signal(s, _handle) for s in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in _state.previous.items():
            signal.signal(signum, handler)
        _state.installed = False
        _state.phase, _state.received, _state.on_first = "starting", None, None


def reinstall() -> None:
    """Put our handler back where a library replaced it (ray.init installs its own SIGTERM handler)."""
    if _mine():
        for signum in SIGNALS:
            signal.signal(signum, _handle)


def _mine() -> bool:
    """The handlers are installed, by this thread's run (a run in another thread must not change their phase)."""
    return _state.installed and threading.get_ident() == _state.owner


def enter(phase: str, on_first=None) -> None:
    """training: signals request a checkpoint; finishing: signals are noted. `on_first(signum)` runs on the first
    signal of the training phase."""
    if not _mine():
        return
    _state.phase = phase
    if phase == "training":
        _state.on_first = on_first
        if _state.received is not None and on_first is not None:  # (asked before the workers started)
            on_first(_state.received)


def installed() -> bool:
    return _state.installed


def received() -> int | None:
    """The signal that asked this thread's run to stop (None: none)."""
    return _state.received if _mine() else None


def request_stop(run_dir: Path, signum: int) -> None:
    """The driver of a Ray run asks the workers to checkpoint and stop (they read it after every step)."""
    from leap_finetune.files import write_atomic

    try:
        write_atomic(Path(run_dir) / STOP_REQUEST, str(int(signum)))
    except OSError as err:  # the folder is gone or full: say so, the second signal still stops at once
        _say(f"could not ask the workers to stop ({err}); send the signal again to stop at once\n")


def read_request(run_dir: Path) -> int | None:
    try:
        return int((Path(run_dir) / STOP_REQUEST).read_text(encoding="utf-8").strip() or signal.SIGTERM)
    except (OSError, ValueError):
        return None


def clear_request(run_dir: Path) -> None:
    try:
        (Path(run_dir) / STOP_REQUEST).unlink()
    except OSError:
        pass


def die_with_parent(signum: int = signal.SIGKILL, parent: int | None = None) -> None:
    """In a forked child (Linux): get `signum` when the parent dies (PR_SET_PDEATHSIG), and die at once if it
    already has (`parent`: its pid before the fork). Elsewhere: nothing."""
    import os

    if _LIBC is None:
        return
    _LIBC.prctl(1, int(signum))  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signum)


def leave_signals_to_the_training_process() -> None:
    """Data-loader worker processes ignore Ctrl-C and SIGTERM; the training process answers them (above).

    SLURM's scancel and preemption, systemd and a terminal's Ctrl-C signal every process of the job. torch gives
    each data-loader worker a SIGTERM handler that ends it, and a forked worker inherits our Python SIGINT handler:
    the worker died, and the training process then raised "DataLoader worker (pid N) is killed by signal" in the
    middle of saving its checkpoint (measured with 2 workers: the run was lost), or printed the stop notice once
    per worker. A worker that ignores both still ends with its training process (torch's workers watch their
    parent and are told to stop through their queue). torch offers no option for this, and transformers' Trainer
    and sentence-transformers build their own loaders (with worker_init_fn only for training, where there is one),
    so the one place every worker passes - torch's call that sets its signal handlers - is wrapped, once per
    process (forked workers inherit it; the `spawn` context re-imports torch and keeps torch's handlers)."""
    from torch.utils.data._utils import signal_handling

    original = signal_handling._set_worker_signal_handlers
    if getattr(original, "leap_finetune", False):
        return

    def set_worker_signal_handlers(*args, **kwargs):
        original(*args, **kwargs)
        for signum in SIGNALS:
            signal.signal(signum, signal.SIG_IGN)

    set_worker_signal_handlers.leap_finetune = True
    signal_handling._set_worker_signal_handlers = set_worker_signal_handlers
