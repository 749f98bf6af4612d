"""Files written whole or not at all, and the run's metrics.jsonl read back (light: no torch or transformers import, so that `leap-finetune eval`
and the driver start fast)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write a file so that readers see either the old content or the whole new content."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def pid_alive(pid: int) -> bool:
    """A process of this host with this id exists (staging folders are named after the process that writes them:
    a dead one's are swept)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_metrics(path: Path) -> list[dict]:
    """The records of a run's metrics.jsonl, in order (none if it does not exist yet; a line being written
    is skipped)."""
    import json

    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


DISK_FULL_WORDS = (
    "No space left",
    "Disk quota exceeded",
    "StorageFull",
    "QuotaExceeded",
    "file write failed",
    "unexpected pos",
)


def is_disk_full(err: BaseException) -> bool:
    """An error (or one it was raised from) that a full disk or an exhausted quota causes, in the forms the
    libraries give it: OSError errno 28/122, Arrow's and safetensors' messages, torch.save's "file write failed" and
    "unexpected pos" (its zip writer found fewer bytes on disk than it wrote)."""
    import errno

    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(word in str(err) for word in DISK_FULL_WORDS):
            return True
        err = err.__cause__ or err.__context__
        seen += 1
    return False


def check_writable(folder: Path, key: str) -> None:
    """The run folder can be created: its nearest existing parent is a folder we can write in. A
    probe file is made and removed there (read-only file systems and permissions both show)."""
    import errno
    import tempfile

    from leap_finetune.errors import LeapError

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise LeapError(
            "this is a file, not a folder",
            where=f"{key}: {folder}",
            fix=f"set {key} to a folder path (it is created if missing)",
        )
    parent = folder
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise LeapError(
            f"cannot create the folder: {parent} is a file",
            where=f"{key}: {folder}",
            fix=f"set {key} to a path inside a folder",
        )
    try:
        handle, probe = tempfile.mkstemp(prefix=".leap-write-check-", dir=parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        hint = (
            "a read-only file system"
            if err.errno == errno.EROFS
            else "no permission to write"
            if err.errno in (errno.EACCES, errno.EPERM)
            else reason
        )
        raise LeapError(
            f"cannot write in {parent} ({hint})",
            where=f"{key}: {folder}",
            fix=f"set {key} to a folder you can write in",
        ) from None
