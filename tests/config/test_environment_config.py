"""GRPO's `environment:` at validate (validate/environment.py): the tools loaded and described where the config says,
every way of getting it wrong refused with the fix, and the rows' prompts shown the environment's tools."""

from __future__ import annotations

import json
import textwrap

import pytest

from leap_finetune.errors import DataError, LeapError
from leap_finetune.validate.loader import load_config
from tests.conftest import write_config, write_jsonl

TOOLS = '''
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b
'''
ENV = '''
class Shop:
    def reset(self, row):
        self.stock = dict(row.get("stock") or {})

    def buy(self, item: str) -> str:
        """Buy one item.

        Args:
            item: What to buy.
        """
        return "ok"
'''
SCHEMAS = [{"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}}]


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "tools.py").write_text(textwrap.dedent(TOOLS))
    (tmp_path / "shop.py").write_text(textwrap.dedent(ENV))
    (tmp_path / "handler.py").write_text("def call(name, arguments):\n    return name\n")
    (tmp_path / "tools.json").write_text(json.dumps(SCHEMAS))
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "What is 2 + 3?", "solution": "5"}] * 4)
    return tmp_path


def _config(environment, **overrides) -> dict:
    config = {
        "project_name": "agents",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": ["accuracy"],
        "environment": environment,
        "training_config": {"use_vllm": False},
        **overrides,
    }
    return {k: v for k, v in config.items() if v is not None}


def _error(folder, config) -> LeapError:
    with pytest.raises(LeapError) as info:
        load_config(write_config(folder, config))
    return info.value


def test_python_functions_become_tool_definitions(folder):
    resolved = load_config(write_config(folder, _config({"tools": "./tools.py", "max_turns": 3})))
    environment = resolved.environment
    assert environment["source"] == {"kind": "functions", "file": str(folder / "tools.py"), "name": None, "schemas": []}
    assert environment["schemas"][0]["name"] == "add" and environment["max_turns"] == 3
    assert environment["schemas"][0]["parameters"]["required"] == ["a", "b"]


def test_a_class_and_json_schemas_with_a_handler_are_sources_too(folder):
    shop = load_config(write_config(folder, _config({"tools": "./shop.py::Shop"}))).environment
    assert shop["source"]["kind"] == "class" and [s["name"] for s in shop["schemas"]] == ["buy"]
    given = load_config(write_config(folder, _config({"tools": "./tools.json", "handler": "./handler.py::call"})))
    assert given.environment["source"]["kind"] == "handler" and given.environment["schemas"] == SCHEMAS
    inline = load_config(write_config(folder, _config({"tools": SCHEMAS, "handler": "./handler.py::call"})))
    assert inline.environment["schemas"] == SCHEMAS


@pytest.mark.parametrize(
    ("environment", "overrides", "said"),
    [
        (
            {"tools": "./tools.py"},
            {"training_type": "sft", "rewards": None, "training_config": {"max_steps": 1}},
            "no benchmark has metric episodes, so it would do nothing",
        ),
        ({"tools": "./missing.py"}, {}, "does not exist"),
        ({"tools": "./shop.py::Nope"}, {}, "no class 'Nope'"),
        ({"tools": "./tools.json"}, {}, "they need `handler`"),
        ({"tools": "./tools.py", "handler": "./handler.py::call"}, {}, "handler is for JSON-schema tools"),
        ({"tools": "./tools.txt"}, {}, "expected a Python file"),
        ({"tools": "./tools.py", "max_turns": 0}, {}, "max_turns"),
        ({"tools": "./tools.py", "tool_timout": 3}, {}, "tool_timout"),
        ({"tools": "./tools.py"}, {"rewards": ["tool_call_match"]}, "scores a single turn's tool call"),
        (None, {"rewards": ["accuracy", "tool_success"]}, "scores a multi-turn episode"),
        ({"tools": "./tools.py"}, {"rewards": [{"name": "turn_penalty"}]}, "needs per_turn"),
        ({"tools": "./tools.py"}, {"rewards": [{"name": "turn_penalty", "per_turn": -1}]}, "per_turn is -1"),
    ],
)
def test_mistakes_are_refused_with_what_to_write(folder, environment, overrides, said):
    error = _error(folder, _config(environment, **overrides))
    assert said in error.format()
    assert error.fix


def test_a_docstring_that_does_not_describe_an_argument_is_refused(folder):
    (folder / "vague.py").write_text('def find(query: str) -> str:\n    """Find."""\n    return query\n')
    error = _error(folder, _config({"tools": "./vague.py"}))
    assert "find() in" in error.message and "no description for the argument 'query'" in error.message
    assert "Args:" in error.fix


def test_prompts_are_shown_the_environment_tools_and_rows_may_not_bring_their_own(folder):
    from leap_finetune.api import inspect_config

    config = write_config(folder, _config({"tools": "./tools.py"}))
    items = inspect_config(str(config), rows=1)
    prompt = items[0]["prompt"] if "prompt" in items[0] else json.dumps(items[0])
    assert '<|tool_list_start|>[{"name": "add"' in prompt
    write_jsonl(folder / "prompts.jsonl", [{"prompt": "hi", "solution": "5", "tools": SCHEMAS}])
    with pytest.raises(DataError) as info:
        inspect_config(str(config), rows=1)
    assert "the row has its own `tools`" in info.value.format()


@pytest.mark.parametrize(
    ("files", "environment", "said"),
    [
        ({"t.py": "import sys\nsys.exit(3)\n"}, {"tools": "./t.py"}, "called sys.exit(3)"),
        # (validate imports the tools in a worker first: os._exit there would have ended validate itself, silently)
        ({"t.py": "import os\nos._exit(0)\n"}, {"tools": "./t.py"}, "ended while they were imported (exit code 0"),
        ({"e.py": "class E:\n    def reset(self):\n        pass\n"}, {"tools": "./e.py::E"}, "does not take the row"),
        (
            {"e.py": "class E:\n    def __init__(self, x):\n        pass\n    def reset(self, row):\n        pass\n"},
            {"tools": "./e.py::E"},
            "cannot be created without arguments",
        ),
        (
            {"h.py": "def call(name):\n    return name\n"},
            {"tools": "./tools.json", "handler": "./h.py::call"},
            "not a function of (name, arguments)",
        ),
        ({"h.py": "call = 42\n"}, {"tools": "./tools.json", "handler": "./h.py::call"}, "(it is int)"),
        ({}, {"tools": "./tools.json", "handler": "./gone.py::call"}, "the handler file"),
        ({"t.py": "def f(**kw) -> str:\n    '''F.'''\n"}, {"tools": "./t.py"}, "takes **kw"),
    ],
)
def test_what_would_fail_only_after_the_model_loads_is_caught_at_validate(folder, files, environment, said):
    for name, text in files.items():
        (folder / name).write_text(text)
    assert said in _error(folder, _config(environment)).format()


@pytest.mark.parametrize(
    ("parameters", "said"),
    [
        ({"type": "object", "properties": {"x": {"type": "strng"}}}, "is not a valid JSON schema"),
        ({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x", "zz"]}, "required names ['zz']"),
    ],
)
def test_json_definitions_that_every_call_would_fail_on_are_refused(folder, parameters, said):
    schemas = [{"name": "add", "description": "Add.", "parameters": parameters}]
    error = _error(folder, _config({"tools": schemas, "handler": "./handler.py::call"}))
    assert said in error.message and "environment.tools[0] (add)" in error.message
