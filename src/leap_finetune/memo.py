"""What the training libraries answered about a config, kept across commands, so that `validate` and `plan` import
TRL (and through it peft, torch and torch's compiler: ~3 s of a ~4 s `validate` on 2 cores) only when something
they would answer has changed.

The checks that need TRL - which keys its config class has, what a value is coerced to, whether the config class
accepts the arguments - are answered the same for the same question: each answer is stored under a digest of the
question, the installed versions of the libraries that answer it, which optional packages are installed, and
leap-finetune's own code. Only answers are stored, never refusals: a config the libraries refuse is asked again (and
refused again, with its message). LEAP_FINETUNE_MEMO=0 turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
LIBRARIES = ("trl", "transformers", "peft", "accelerate", "torch", "sentence-transformers")
OPTIONAL = ("bitsandbytes", "torchao", "torch_optimi", "flash_attn", "liger_kernel", "wandb", "tensorboard")


def remembered(kind: str, question: object, answer: Callable[[], T]) -> T:
    """answer(), or what it returned the last time the same question was asked under the same libraries."""
    if os.environ.get("LEAP_FINETUNE_MEMO", "1") == "0":
        return answer()
    try:
        text = json.dumps([kind, question, _setting()], sort_keys=True, default=_tagged)
    except (TypeError, ValueError):
        return answer()
    path = _folder() / f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:40]}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))["answer"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = answer()
    _store(path, value)
    return value


def _tagged(value) -> list:
    """A value JSON has no type for, with its type: YAML's date 2026-01-01 and the text '2026-01-01' are two
    questions."""
    return [type(value).__qualname__, str(value)]


def _store(path: Path, value) -> None:
    """Written whole (files.py's way), and only a value that reads back equal (a tuple, an enum would not)."""
    from leap_finetune.files import write_atomic

    try:
        text = json.dumps({"answer": value})
        if json.loads(text)["answer"] != value:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except (OSError, TypeError, ValueError):
        pass  # (a read-only or full cache folder: the next command asks again)


_SETTING: list = []


def _setting() -> list:
    """The installed libraries' versions, the optional packages present, and leap-finetune's code (its files'
    sizes and times: a changed check must not be answered from before the change)."""
    if not _SETTING:
        import importlib.util
        from importlib.metadata import PackageNotFoundError, version

        versions = []
        for name in LIBRARIES:
            try:
                versions.append(f"{name}=={version(name)}")
            except PackageNotFoundError:
                versions.append(f"{name}: none")
        present = [name for name in OPTIONAL if importlib.util.find_spec(name) is not None]
        package = Path(__file__).parent
        code = hashlib.sha256()
        for path in sorted(package.rglob("*.py")):
            stat = path.stat()
            code.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        import sys

        # (the environment itself: another venv or machine sharing ~/.cache answers for its own packages)
        _SETTING.extend([versions, present, code.hexdigest(), sys.executable, sys.prefix])
    return _SETTING


def _folder() -> Path:
    """Beside the prepared-data cache (LEAP_FINETUNE_CACHE when set: a dot-folder, which its pruning passes by)."""
    configured = os.environ.get("LEAP_FINETUNE_CACHE")
    if configured:
        return Path(configured).expanduser() / ".answers"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "leap-finetune" / "answers"
