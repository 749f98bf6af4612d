"""One live run per run folder, and workers that die with their driver.

The driver holds an exclusive `flock` on RUN/.leap-run.lock for as long as the run lives; the file says who
holds it (process id, host, a token of this run, the command). The kernel releases the lock when the process
ends however it ends (SIGKILL included), so a lock left by a dead run never blocks anything, and nothing has
to be cleaned up by hand.

- A second run (a resume, or a new run aimed at the same output_dir) finds the lock taken and stops with an
  error naming the first run's process and host, before it changes anything.
- A new run's folder is built under a temporary name with the lock already taken, then renamed into place: two
  new runs racing for one folder cannot both get it.
- Ray workers watch the lock (`watch_driver`): when the driver that started them is gone (no live holder, or a
  newer run's token), they stop at once instead of training on headless. Ray's own fate-sharing stops the local
  instance's daemons, but measured with Ray 2.60, workers orphaned by a SIGKILLed driver kept training and
  writing checkpoints for tens of seconds.

Written by hand because no library does this: `filelock` gives the lock but not the holder's identity, and
the workers' check needs a lock query that never takes the lock from the driver.
A file system without `flock` (some parallel file systems) gets a warning: one run per folder is then not
enforced there. NFS supports it (the client turns it into NFS locks).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

from leap_finetune.errors import LeapError

LOCK_NAME = ".leap-run.lock"
# A process that takes a lock only to see whether its holder is alive (a worker's check) holds it for
# microseconds; a run that gives up its lock hands it on: so a busy lock is tried again for this long.
RETRY_S = 3.0


def _flock():
    try:
        import fcntl
    except ImportError:  # Windows: no flock
        return None
    return fcntl


_HELD: list = []  # the open lock files of this process


def _close_in_child() -> None:
    """A forked child (a DataLoader worker, a pool) shares the parent's open file description, and with it the
    flock: it must not keep the run folder locked after the driver died."""
    for handle in _HELD:
        try:
            handle.close()  # (the child's copy: the parent's descriptor keeps the lock)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class RunLock:
    """The exclusive lock of one run folder, held by the driver."""

    def __init__(self, handle, path: Path, token: str):
        self.handle = handle
        self.path = path
        self.token = token

    @classmethod
    def take(cls, folder: Path, *, where: str = "the run folder") -> RunLock:
        """Lock `folder` (it must exist) or raise the error that names the run holding it."""
        path = Path(folder) / LOCK_NAME
        fcntl = _flock()
        handle = open(path, "a+", encoding="utf-8")  # (never truncated before the lock is ours)
        token = uuid.uuid4().hex
        if fcntl is not None:
            deadline = time.monotonic() + RETRY_S
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as err:
                    if err.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):
                        print(
                            f"warning: this file system has no file locks ({path}): a second run in the same "
                            "folder cannot be refused",
                            file=sys.stderr,
                            flush=True,
                        )
                        break
                    if err.errno not in (errno.EWOULDBLOCK, errno.EACCES) or time.monotonic() > deadline:
                        holder = read_holder(Path(folder))
                        handle.close()
                        raise busy_error(Path(folder), holder, where) from None
                    time.sleep(0.1)
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "token": token,
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "started_at": time.time(),  # (`latest` orders runs by it: launch/resume_latest.py)
                    "command": " ".join(sys.argv),
                }
            )
        )
        handle.flush()
        _HELD.append(handle)
        return cls(handle, path, token)

    def moved_to(self, folder: Path) -> None:
        """The locked folder was renamed (a new run's staging folder put in place): the lock goes with the file."""
        self.path = Path(folder) / LOCK_NAME

    def release(self) -> None:
        if self.handle is not None:
            if self.handle in _HELD:
                _HELD.remove(self.handle)
            self.handle.close()  # (closing releases the flock)
            self.handle = None


def read_holder(folder: Path) -> dict:
    try:
        value = json.loads((Path(folder) / LOCK_NAME).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def busy_error(folder: Path, holder: dict, where: str) -> LeapError:
    who = f"process {holder.get('pid', '?')} on {holder.get('host', '?')}"
    since = f", started {holder['started']}" if holder.get("started") else ""
    command = f" ({holder['command']})" if holder.get("command") else ""
    return LeapError(
        f"another run is live in this folder: {who}{since}{command}",
        where=f"{where}: {folder}",
        fix="wait for it to end or stop it (Ctrl-C or kill -TERM: it saves a checkpoint), then resume; "
        "or give this run another output_dir",
    )


def lock_state(folder: Path) -> bool | None:
    """True: some process holds the folder's lock now; False: none does; None: cannot tell (no lock file, or a
    file system without flock). A query: it takes the lock for an instant at most."""
    fcntl = _flock()
    path = Path(folder) / LOCK_NAME
    if fcntl is None or not path.exists():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    return True
                return None
            return False  # (released on close)
    except OSError:
        return None


def is_live(folder: Path) -> bool:
    """Some process holds the folder's lock now."""
    return lock_state(folder) is True


def check_free(folder: Path, where: str = "the run folder") -> None:
    """`validate`: the folder a run would use is not held by a live run."""
    if is_live(folder):
        raise busy_error(Path(folder), read_holder(Path(folder)), where)


def watch_driver(folder: Path, token: str, every_s: float = 0.5) -> threading.Thread | None:
    """In a Ray worker: a daemon thread that ends this process when the driver that holds `token` is gone."""
    if _flock() is None or not token:
        return None

    def watch():
        # Only a lock this worker has seen held, then free, means its driver is gone: where locks do not reach
        # this node (a file system whose locks are node-local) it is never seen held, and the worker trains on
        # (Ray ends a remote job's workers when its driver disconnects). A missing lock file (the run folder
        # deleted) is the training loop's to report, on every rank.
        seen_held = False
        while True:
            time.sleep(every_s)
            holder = read_holder(folder)
            state = lock_state(folder)
            if holder and holder.get("token") != token:
                reason = f"another run (process {holder.get('pid')} on {holder.get('host')}) now holds the run folder"
            elif state is True:
                seen_held = True
                continue
            elif state is False and seen_held:
                reason = "its driver process is gone"
            else:
                continue
            print(f"leap-finetune worker (pid {os.getpid()}): stopping, {reason}", file=sys.stderr, flush=True)
            # SIGKILL, not os._exit: measured in a Ray worker, os._exit from this thread returned to the loop
            # and the worker trained on
            os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="leap-watch-driver", daemon=True)
    thread.start()
    return thread
