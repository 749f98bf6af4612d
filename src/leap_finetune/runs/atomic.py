"""A folder written whole or not at all. Our own: the standard library renames a directory only onto an empty one
(or none), and no library we use offers a swap of two non-empty folders."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

RENAME_EXCHANGE = 2  # linux/fs.h: swap two paths in one step (Linux 3.15+)
AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (renameat2 RENAME_EXCHANGE); False where the kernel, libc or filesystem
    cannot."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0


def replace_folder(target: Path, write: Callable[[Path], None], *, before_swap: Callable[[], None] | None = None,
                   staging_suffix: str = ".partial") -> None:
    """`write(staging)` fills a sibling staging folder (.NAME.partial, removed first if an earlier attempt left
    one); then the staging folder takes `target`'s place in one step - swapped with an existing target where the
    system can (renameat2), else the old target is moved aside first and removed after - and the old folder is
    deleted. A failure while writing leaves `target` as it was and no staging folder. `before_swap`: a hook between
    the write and the swap (the tests kill the process there)."""
    target = Path(target)
    staging = target.with_name(f".{target.name}{staging_suffix}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if before_swap is not None:
        before_swap()
    swap_in(staging, target)


def swap_in(staging: Path, target: Path) -> None:
    """A complete folder takes `target`'s place in one step (see replace_folder); the old one is deleted."""
    staging, target = Path(staging), Path(target)
    if not target.exists():
        staging.rename(target)
        return
    if _exchange(staging, target):
        shutil.rmtree(staging)  # (now the old folder)
        return
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    target.rename(old)
    staging.rename(target)
    shutil.rmtree(old)
