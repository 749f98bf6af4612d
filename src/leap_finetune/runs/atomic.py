"""A folder written whole or not at all. Our own: the standard library renames a directory only onto an empty one
(or none), and no library we use offers a swap of two non-empty folders."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

RENAME_EXCHANGE = 2  # linux/fs.h: swap two paths in one step (Linux 3.15+)
AT_FDCWD = -100
# renameat2 missing (old libc or kernel) or the filesystem without RENAME_EXCHANGE (NFS, some FUSE): move aside
NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (renameat2 RENAME_EXCHANGE). False where the system cannot swap; any
    other failure (a missing path, no permission) is raised."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in NO_EXCHANGE:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _old_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.old-{os.getpid()}")  # (per process: two may swap the same target)


def recover(target: Path) -> None:
    """A process killed between the two renames of the move-aside swap left the old folder at .NAME.old-PID and
    nothing at NAME: put it back."""
    target = Path(target)
    if target.exists():
        return
    for old in sorted(target.parent.glob(f".{target.name}.old-*")):
        if old.is_dir():
            old.rename(target)
            return


def replace_folder(
    target: Path,
    write: Callable[[Path], None],
    *,
    before_swap: Callable[[], None] | None = None,
    staging_suffix: str = ".partial",
) -> None:
    """`write(staging)` fills a sibling staging folder (.NAME.partial, removed first if an earlier attempt left
    one); then the staging folder takes `target`'s place (swap_in). A failure while writing or swapping leaves
    `target` as it was and no staging folder. `before_swap`: a hook between the write and the swap (the tests
    kill the process there)."""
    target = Path(target)
    recover(target)
    staging = target.with_name(f".{target.name}{staging_suffix}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write(staging)
        if not staging.is_dir():
            raise FileNotFoundError(errno.ENOENT, "the writer left no folder to swap in", str(staging))
        if before_swap is not None:
            before_swap()
        swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def swap_in(staging: Path, target: Path) -> None:
    """A complete folder takes `target`'s place: swapped with the old one in one step
    (renameat2) where the system can, else the old one is moved aside first (put back if the second rename fails;
    `recover` puts it back after a kill between the two). The old folder is then deleted, as far as it can be."""
    staging, target = Path(staging), Path(target)
    # (no fsync of the new folder's files: measured on this project's CI disk it made the quickstart test 33 ->
    # 193 s; checkpoints are synced by their marker, and a power loss is not among the faults handled here)
    if not target.exists():
        staging.rename(target)
    elif _exchange(staging, target):
        shutil.rmtree(staging, ignore_errors=True)  # (now the old folder)
    else:
        old = _old_name(target)
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
        try:
            staging.rename(target)
        except BaseException:
            old.rename(target)
            raise
        shutil.rmtree(old, ignore_errors=True)
