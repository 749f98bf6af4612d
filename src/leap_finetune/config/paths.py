"""Paths in a config: `~` is expanded, and a relative path starts at the config file's folder (the
current folder for a config given as a Python dict), whatever the working directory."""

from __future__ import annotations

from pathlib import Path


def local_path(text: str, base: Path) -> Path:
    path = Path(text).expanduser()
    return (path if path.is_absolute() else base / path).resolve()
