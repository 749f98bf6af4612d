"""A user's own function named in the config as `path/to/file.py::name` (custom rewards, custom metrics):
the file imported as a module, the function looked up, every failure a LeapError that says which."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from leap_finetune.errors import LeapError


def load_user_function(spec: str, *, kind: str, where: str, signature: str) -> Callable:
    """`kind` names it in errors ("custom reward"); `signature` is the def line to suggest."""
    file, _, name = spec.partition("::")
    module_spec = importlib.util.spec_from_file_location(f"leap_user_{kind.replace(' ', '_')}_{abs(hash(file))}", file)
    if module_spec is None:
        raise LeapError(
            f"the {kind} file {file} cannot be imported",
            where=where,
            fix="point at a .py file: ./my_file.py::my_function",
        )
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except FileNotFoundError:
        raise LeapError(
            f"the {kind} file {file} does not exist",
            where=where,
            fix="the path is relative to the config file's folder",
        ) from None
    except Exception as err:  # noqa: BLE001 - the user's file
        raise LeapError(
            f"cannot import the {kind} file {file}: {type(err).__name__}: {err}",
            where=where,
            fix="correct the file (it is imported as a Python module)",
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise LeapError(f"no function '{name}' in {file}", where=where, fix=f"define {signature.format(name=name)}")
    return function
