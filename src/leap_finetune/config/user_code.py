"""A user's own function named in the config as `path/to/file.py::name` (custom rewards, custom metrics):
the file imported as a module, the function looked up, every failure a LeapError that says which."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from leap_finetune.errors import LeapError


def import_user_file(
    file: str, *, what: str, where: str, path_fix: str = "the path is relative to the config file's folder"
):
    """The user's file (`what`: how errors name it, "custom reward file") imported as a module; every failure - a
    missing file, an exception, sys.exit() at its top level, which would otherwise end validate silently - a
    LeapError at `where`. (Shared by custom rewards and metrics, and GRPO environments' tools: rl/tool_specs.py.)"""
    from pathlib import Path

    module_spec = importlib.util.spec_from_file_location(f"leap_user_{abs(hash((what, file)))}", file)
    if module_spec is None or not Path(file).is_file():
        missing = not Path(file).exists()
        raise LeapError(
            f"the {what} {file} does not exist" if missing else f"{file} is not a Python file",
            where=where,
            fix=path_fix,
        )
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SystemExit as err:
        raise LeapError(
            f"importing the {what} {file} called sys.exit({err.code!r})",
            where=where,
            fix="keep the file's top level to definitions (put a script's code under if __name__ == '__main__':)",
        ) from None
    except Exception as err:  # noqa: BLE001 - the user's file
        raise LeapError(
            f"cannot import the {what} {file}: {type(err).__name__}: {err}",
            where=where,
            fix="correct the file (it is imported as a Python module)",
        ) from None
    return module


def load_user_function(spec: str, *, kind: str, where: str, signature: str) -> Callable:
    """`kind` names it in errors ("custom reward"); `signature` is the def line to suggest."""
    file, _, name = spec.partition("::")
    module = import_user_file(file, what=f"{kind} file", where=where)
    function = getattr(module, name, None)
    if not callable(function):
        raise LeapError(f"no function '{name}' in {file}", where=where, fix=f"define {signature.format(name=name)}")
    return function
