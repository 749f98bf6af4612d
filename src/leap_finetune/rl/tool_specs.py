"""An environment's tools: where they come from (`environment.tools`), their definitions as the model sees them, and
the calls checked against those definitions before anything runs.

Three sources, one interface (`Toolbox`):
- `./tools.py`: the file's public functions (defined in it, not imported, no leading underscore);
- `./env.py::ClassName`: a stateful environment - `reset(row)` starts an episode on a new instance, the public
  methods are the tools;
- JSON schemas (`./tools.json` or a list in the config) with `handler: ./file.py::function`, called as
  `function(name, arguments)`.

A definition is built by transformers' `get_json_schema` from the type hints and the Google-style docstring (the
format Hugging Face chat templates take), so a tool a model was shown during SFT with `apply_chat_template(tools=
[fn])` is described to it here in the same words. A call's arguments are checked against its definition with
`jsonschema` before the tool runs: a wrong type or a missing argument is the tool's error text, seen by the model.
This module imports no torch: the tool workers (rl/tool_worker.py) import it.
"""

from __future__ import annotations

import inspect
import json
import typing
from dataclasses import dataclass
from pathlib import Path

from leap_finetune.errors import LeapError

RESET = "reset"  # a stateful environment's episode start; not a tool
NOT_TOOLS = {RESET, "close"}


@dataclass(frozen=True)
class ToolSource:
    """`environment.tools` resolved: kind "functions" (file), "class" (file::name), "handler" (schemas + file::name)
    or "http" (`file` is the URL of an OpenEnv server: rl/openenv_http.py)."""

    kind: str
    file: str
    name: str | None = None
    schemas: tuple = ()  # kind "handler": the JSON schemas as given

    def to_json(self) -> dict:
        return {"kind": self.kind, "file": self.file, "name": self.name, "schemas": list(self.schemas)}

    @classmethod
    def from_json(cls, data: dict) -> ToolSource:
        return cls(data["kind"], data["file"], data.get("name"), tuple(data.get("schemas") or ()))


def import_file(file: str, where: str, what: str = "tools file"):
    """The user's file as a module (config/user_code.py: every failure a LeapError at `where`)."""
    from leap_finetune.config.user_code import import_user_file

    fix = "the path is relative to the config file's folder: " + (
        "./tools.py::call_tool" if what == "handler file" else "./tools.py or ./env.py::MyEnvironment"
    )
    return import_user_file(file, what=what, where=where, path_fix=fix)


def _schema(function, owner: str, where: str) -> dict:
    """The tool definition {name, description, parameters} from the function's hints and docstring."""
    from transformers.utils import get_json_schema

    try:
        hints = typing.get_type_hints(function)
    except Exception as err:  # noqa: BLE001 - a hint that names something undefined
        raise LeapError(
            f"the type hints of {owner} cannot be read: {err}", where=where, fix="import what the hints name"
        ) from None
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    if parameters and parameters[0].name == "self":
        parameters = parameters[1:]
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise LeapError(
                f"{owner} takes {'**' if parameter.kind == parameter.VAR_KEYWORD else '*'}{parameter.name}: a tool's "
                "arguments are named one by one",
                where=where,
                fix="give each argument its own parameter with a type hint",
            )

    def shim():  # (get_json_schema reads hints and signature: the method's, without self, hints resolved)
        pass

    shim.__name__, shim.__doc__ = function.__name__, function.__doc__
    shim.__signature__ = signature.replace(parameters=parameters)
    shim.__annotations__ = {k: v for k, v in hints.items() if k != "self"}
    try:
        schema = get_json_schema(shim)["function"]
    except Exception as err:  # noqa: BLE001 - transformers' DocstringParsingException / TypeHintParsingException
        raise LeapError(
            f"{owner} cannot be described to the model: {err}",
            where=where,
            fix="give it a type hint for every argument and a Google-style docstring: a first line saying what "
            "it does, then `Args:` with one line `name: what it is` per argument",
        ) from None
    schema.pop("return", None)
    return schema


@dataclass
class Toolbox:
    """The tools, loaded in this process: their definitions and how to call them."""

    source: ToolSource
    schemas: list[dict]
    functions: dict  # name -> callable (kind "functions"), unbound method (kind "class"), or the handler
    environment_class: type | None = None

    def new_instance(self, row: dict, timeout: float = 10.0):
        """A stateful environment's instance for one episode (after its reset(row)); None without one."""
        if self.source.kind == "http":
            from leap_finetune.rl.openenv_http import HttpEnvironment

            instance = HttpEnvironment(self.source.file, timeout)
            instance.reset(row)
            return instance
        if self.environment_class is None:
            return None
        instance = self.environment_class()
        getattr(instance, RESET)(row)
        return instance

    def run(self, instance, name: str, arguments: dict):
        if self.source.kind == "handler":
            return self.functions["handler"](name, arguments)
        if self.source.kind == "http":
            return instance.call(name, arguments)
        function = self.functions[name]
        return function(instance, **arguments) if instance is not None else function(**arguments)


def call_problem(schemas: list[dict], name: str, arguments: dict) -> str | None:
    """Why this call cannot run (an undeclared tool, arguments that break its definition); None when it can."""
    schema = next((s for s in schemas if s["name"] == name), None)
    if schema is None:
        return f"error: there is no tool named {name!r}; the tools are: {', '.join(s['name'] for s in schemas)}"
    import jsonschema

    try:
        jsonschema.validate(arguments, schema.get("parameters") or {"type": "object"})
    except jsonschema.ValidationError as err:
        at = ".".join(str(p) for p in err.absolute_path)
        return f"error: bad arguments for {name}: {(at + ': ') if at else ''}{err.message}"
    except jsonschema.SchemaError as err:
        return f"error: the definition of {name} is not a valid JSON schema: {err.message}"
    return None


def _takes(function, arguments: int) -> bool:
    """Whether `function` can be called with this many positional arguments."""
    try:
        inspect.signature(function).bind(*([None] * arguments))
        return True
    except TypeError:
        return False
    except ValueError:  # (no signature to read: a builtin)
        return True


def load_toolbox(source: ToolSource, where: str, *, describe: bool = True) -> Toolbox:
    """The tools of `source`, imported here; `describe=False` (the tool workers) skips building their definitions
    (which imports transformers: seconds a worker does not need)."""
    if source.kind == "http":
        from leap_finetune.rl.openenv_http import server_tools

        return Toolbox(source, server_tools(source.file, where) if describe else [], {})
    module = import_file(source.file, where, "handler file" if source.kind == "handler" else "tools file")

    def schemas_of(functions: dict, owner) -> list[dict]:
        return [_schema(f, owner(name), where) for name, f in functions.items()] if describe else []

    if source.kind == "functions":
        functions = {
            name: value
            for name, value in vars(module).items()
            if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == module.__name__
        }
        if not functions:
            raise LeapError(
                f"{source.file} defines no public function to offer as a tool",
                where=where,
                fix="define the tools in it (def name(arg: type) -> str with a docstring), or name a class: "
                "./env.py::MyEnvironment",
            )
        return Toolbox(source, schemas_of(functions, lambda name: f"{name}() in {source.file}"), functions)
    found = getattr(module, source.name or "", None)
    if source.kind == "class":
        if not inspect.isclass(found):
            raise LeapError(
                f"no class '{source.name}' in {source.file}",
                where=where,
                fix="name a class with reset(self, row) and its tools as methods",
            )
        if not callable(getattr(found, RESET, None)) or not _takes(getattr(found, RESET), 2):
            raise LeapError(
                f"{source.name} has no reset(self, row) method"
                + (" (its reset does not take the row)" if callable(getattr(found, RESET, None)) else ""),
                where=where,
                fix="add def reset(self, row): ... - it starts an episode from the dataset row",
            )
        if not _takes(found, 0):
            raise LeapError(
                f"{source.name}() cannot be created without arguments (one instance is made per episode)",
                where=where,
                fix="give __init__'s arguments defaults, or set them up in reset(self, row)",
            )
        methods = {
            name: value
            for name, value in vars(found).items()
            if inspect.isfunction(value) and not name.startswith("_") and name not in NOT_TOOLS
        }
        if not methods:
            raise LeapError(f"{source.name} has no public method to offer as a tool", where=where, fix="add one")
        schemas = schemas_of(methods, lambda name: f"{source.name}.{name}()")
        return Toolbox(source, schemas, methods, environment_class=found)
    if not callable(found) or not _takes(found, 2):
        what = "no function" if found is None else "not a function of (name, arguments)"
        raise LeapError(
            f"environment.handler: {source.name!r} in {source.file}: {what}"
            + (f" (it is {type(found).__name__})" if found is not None and not callable(found) else ""),
            where=where,
            fix=f"define def {source.name or 'call_tool'}(name: str, arguments: dict) in it",
        )
    return Toolbox(source, [_bare(s) for s in source.schemas], {"handler": found})


def _bare(schema: dict) -> dict:
    """A definition as the model sees it: {name, description, parameters} (OpenAI's {type, function} unwrapped)."""
    return dict(schema.get("function", schema))


def _schema_problem(tool: dict) -> str | None:
    """What is wrong with a definition's `parameters` (every call would fail on it)."""
    import jsonschema

    parameters = tool.get("parameters")
    if parameters is None:
        return None
    try:
        jsonschema.validators.validator_for(parameters).check_schema(parameters)
    except jsonschema.SchemaError as err:
        return f"parameters is not a valid JSON schema: {err.message}"
    properties = parameters.get("properties") or {}
    missing = [name for name in parameters.get("required") or [] if name not in properties]
    return f"required names {missing}, which are not among its properties" if missing else None


def schemas_from(value, base: Path, where: str) -> list[dict]:
    """JSON-schema `tools`: a list in the config or a .json file holding one; each has a name."""
    if isinstance(value, str):
        path = Path(value).expanduser()
        path = path if path.is_absolute() else base / path
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise LeapError(f"the tools file {path} does not exist", where=where, fix="check the path") from None
        except json.JSONDecodeError as err:
            raise LeapError(
                f"{path} is not JSON ({err.msg}, line {err.lineno})",
                where=where,
                fix='give a list of tool definitions: [{"name": ..., "description": ..., "parameters": {...}}]',
            ) from None
    if not isinstance(value, list) or not value:
        raise LeapError("environment.tools holds no tool definition", where=where, fix="give a list of JSON schemas")
    out = []
    for index, schema in enumerate(value):
        bare = _bare(schema) if isinstance(schema, dict) else None
        if not isinstance(bare, dict) or not isinstance(bare.get("name"), str) or not bare["name"].isidentifier():
            raise LeapError(
                f"environment.tools[{index}] is not a tool definition with a name (a Python identifier)",
                where=where,
                fix='write {"name": "add", "description": "...", "parameters": {"type": "object", "properties": '
                "{...}}}",
            )
        problem = _schema_problem(bare)
        if problem:
            raise LeapError(
                f"environment.tools[{index}] ({bare['name']}): {problem}",
                where=where,
                fix='write parameters as a JSON schema: {"type": "object", "properties": {"x": {"type": "integer"}}, '
                '"required": ["x"]}',
            )
        out.append(bare)
    names = [s["name"] for s in out]
    if len(set(names)) != len(names):
        raise LeapError(
            "environment.tools names a tool twice", where=where, fix="give each tool its own name: " + ", ".join(names)
        )
    return out
