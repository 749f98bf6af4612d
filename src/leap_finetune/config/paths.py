"""Paths in a config: `~` is expanded, and a relative path starts at the config file's folder (the
current folder for a config given as a Python dict), whatever the working directory."""

from __future__ import annotations

from pathlib import Path

from leap_finetune.errors import LeapError


def expand_home(text: str) -> Path:
    try:
        return Path(text).expanduser()
    except RuntimeError:  # "~someone" with no such user
        raise LeapError(
            f"cannot expand '{text.split('/')[0]}': no such user's home folder",
            where=text,
            fix="write ~/... for your own home folder, or an absolute path",
        ) from None


def local_path(text: str, base: Path) -> Path:
    path = expand_home(text)
    return (path if path.is_absolute() else base / path).resolve()
