"""Reading the YAML file: floats like `2e-5`, duplicate keys, and errors with line numbers."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from leap_finetune.errors import LeapError


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that reads `2e-5` as a float and refuses duplicate keys.

    PyYAML follows YAML 1.1, where `2e-5` (no dot) is a *string*; every user writes learning
    rates that way, so we accept the YAML 1.2 float syntax.
    """


_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_ConfigLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _construct_mapping(loader: _ConfigLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}' (first at line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    loader.flatten_mapping(node)  # merge keys: the anchored mapping's keys, overridden by explicit ones
    return loader.construct_mapping(node, deep=deep)


_ConfigLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: Path) -> dict:
    if not path.exists():
        raise LeapError("config file not found", where=str(path), fix="check the path you passed")
    if path.is_dir():
        raise LeapError(
            "expected a YAML file, got a folder",
            where=str(path),
            fix="pass the config file, e.g. examples/quickstart.yaml",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise LeapError(
            f"the config file is not UTF-8 text (byte {err.object[err.start]:#04x} on line {line})",
            where=f"{path}:{line}",
            fix="save the file as UTF-8",
        ) from None
    except OSError as err:
        raise LeapError(f"cannot read the config file: {err.strerror}", where=str(path)) from None
    try:
        data = yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(err, "problem", None) or str(err)
        raise LeapError(f"invalid YAML: {problem}", where=where, fix="fix the YAML syntax at that line") from None
    if data is None:
        raise LeapError("the config file is empty", where=str(path), fix="see examples/quickstart.yaml")
    if not isinstance(data, dict):
        raise LeapError(
            f"the config must be a mapping of keys to values, got {type(data).__name__}",
            where=str(path),
            fix="see examples/quickstart.yaml",
        )
    return data


def dump_yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
