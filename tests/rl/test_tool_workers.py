"""The tool workers run a GRPO environment's tools in processes of their own (rl/tool_workers.py): what a tool returns,
raises, prints, allocates or how long it hangs reaches the model as the tool's text, and never the training process.
Real worker processes, real user files."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.rl.tool_specs import ToolSource, call_problem, load_toolbox
from leap_finetune.rl.tool_workers import ToolWorkers

TOOLS = '''
import os, signal, time

def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first.
        b: The second.
    """
    print("a tool that prints must not break the protocol")
    return a + b

def slow(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "woke"

def stuck() -> str:
    """Ignore the alarm and hang (like a call stuck in C code)."""
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(60)
    return "never"

def crash() -> str:
    """Exit the process."""
    os._exit(3)

def hungry(megabytes: int) -> int:
    """Allocate memory.

    Args:
        megabytes: How much.
    """
    return len(bytearray(megabytes * 1024 * 1024))

def table() -> dict:
    """Return a structure."""
    return {"rows": [1, 2], "name": "t"}

def _helper():
    pass
'''

COUNTER = '''
class Counter:
    def reset(self, row):
        self.count = row["start"]

    def bump(self) -> int:
        """Add one and return the count."""
        self.count += 1
        return self.count

    def hang(self) -> str:
        """Hang past the alarm."""
        import signal, time
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        time.sleep(60)
        return "never"
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tools")
    (folder / "tools.py").write_text(textwrap.dedent(TOOLS))
    (folder / "counter.py").write_text(textwrap.dedent(COUNTER))
    return folder


@pytest.fixture(scope="module")
def functions(files):
    workers = ToolWorkers(
        ToolSource("functions", str(files / "tools.py")), workers=2, timeout=1.0, memory_mb=64, max_chars=40
    )
    yield workers
    workers.close()


def test_the_public_functions_are_the_tools_described_by_their_hints_and_docstrings(files):
    toolbox = load_toolbox(ToolSource("functions", str(files / "tools.py")), "test")
    by_name = {s["name"]: s for s in toolbox.schemas}
    assert set(by_name) == {"add", "slow", "stuck", "crash", "hungry", "table"}  # not _helper, not imports
    assert by_name["add"]["description"] == "Add two numbers."
    assert by_name["add"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first."}
    assert by_name["add"]["parameters"]["required"] == ["a", "b"]


def test_calls_return_their_results_and_exceptions_as_text(functions):
    functions.reset([{}, {}])
    out = functions.call(
        [(0, "add", {"a": 2, "b": 3}), (1, "table", {}), (0, "crash", {}), (1, "add", {"a": 1, "b": 1})]
    )
    assert [o.text for o in out[:2]] == ["5", '{"rows": [1, 2], "name": "t"}']
    assert out[0].ok and out[1].ok
    assert not out[2].ok and out[2].text == "error: the tool's process exited during the call"  # (restarted)
    assert out[3].ok and out[3].text == "2"  # (the other worker)
    assert functions.call([(0, "add", {"a": 1, "b": 2})])[0].text == "3"  # (the restarted worker answers)


def test_a_slow_call_is_stopped_at_the_timeout_and_the_worker_goes_on(functions):
    functions.reset([{}])
    slow, after = functions.call([(0, "slow", {"seconds": 30}), (0, "add", {"a": 1, "b": 1})])
    assert not slow.ok and slow.text == "error: the call did not finish within 1 s"
    assert after.ok and after.text == "2"


def test_memory_past_the_limit_is_a_memory_error_the_model_sees(functions):
    functions.reset([{}])
    small, big = functions.call([(0, "hungry", {"megabytes": 8}), (0, "hungry", {"megabytes": 512})])
    assert small.ok and small.text == str(8 * 1024 * 1024)
    assert not big.ok and "MemoryError" in big.text


def test_long_results_are_cut_where_the_model_sees_it(functions):
    functions.reset([{}])
    (out,) = functions.call([(0, "table", {})])
    assert out.text == '{"rows": [1, 2], "name": "t"}'  # (under max_chars: whole)
    (long,) = functions.call([(0, "add", {"a": 10**60, "b": 0})])
    assert long.text.startswith(str(10**60)[:40]) and "[cut: 21 more characters]" in long.text


def test_arguments_are_checked_against_the_definition_before_anything_runs(files):
    schemas = load_toolbox(ToolSource("functions", str(files / "tools.py")), "test").schemas
    assert call_problem(schemas, "add", {"a": 1, "b": 2}) is None
    assert "'x' is not of type 'integer'" in call_problem(schemas, "add", {"a": "x", "b": 2})
    assert "'b' is a required property" in call_problem(schemas, "add", {"a": 1})
    assert "no tool named 'mul'" in call_problem(schemas, "mul", {})


def test_a_stateful_environment_keeps_one_instance_per_episode(files):
    source = ToolSource("class", str(files / "counter.py"), "Counter")
    workers = ToolWorkers(source, workers=2, timeout=1.0, memory_mb=64, max_chars=100)
    try:
        assert workers.reset([{"start": 0}, {"start": 10}, {"start": 100}]) == [None, None, None]
        first = workers.call([(0, "bump", {}), (1, "bump", {}), (2, "bump", {})])
        second = workers.call([(0, "bump", {}), (2, "bump", {})])
        assert [o.text for o in first] == ["1", "11", "101"] and [o.text for o in second] == ["2", "102"]
        # a call stuck past the alarm: its worker (episodes 0 and 2) is killed and started again; those episodes'
        # state is gone and said so, episode 1 (the other worker) goes on
        hung = workers.call([(0, "hang", {})])[0]
        assert not hung.ok and "state is lost" in hung.text
        after = workers.call([(2, "bump", {}), (1, "bump", {})])
        assert not after[0].ok and "lost" in after[0].text
        assert after[1].ok and after[1].text == "12"
        workers.end()
        assert workers.reset([{"start": 5}]) == [None]  # (a new batch starts clean)
        assert workers.call([(0, "bump", {})])[0].text == "6"
    finally:
        workers.close()


def test_a_reset_that_fails_is_reported_per_episode(files):
    source = ToolSource("class", str(files / "counter.py"), "Counter")
    workers = ToolWorkers(source, workers=1, timeout=1.0, memory_mb=64, max_chars=100)
    try:
        errors = workers.reset([{"start": 1}, {"other": 2}])
        assert errors[0] is None and errors[1].startswith("reset(row) failed: KeyError")
    finally:
        workers.close()


def test_tools_that_cannot_be_described_are_refused_with_the_fix(tmp_path):
    (tmp_path / "bad.py").write_text("def f(x: int):\n    return x\n")
    with pytest.raises(LeapError) as err:
        load_toolbox(ToolSource("functions", str(tmp_path / "bad.py")), "config.yaml: environment.tools")
    assert "f() in" in err.value.message and "no docstring" in err.value.message
    assert "Google-style docstring" in err.value.fix
    (tmp_path / "none.py").write_text("from os.path import join\n_x = 1\n")
    with pytest.raises(LeapError, match="defines no public function"):
        load_toolbox(ToolSource("functions", str(tmp_path / "none.py")), "where")
    (tmp_path / "env.py").write_text("class Env:\n    def look(self) -> str:\n        '''Look.'''\n")
    with pytest.raises(LeapError, match="has no reset"):
        load_toolbox(ToolSource("class", str(tmp_path / "env.py"), "Env"), "where")


def test_a_tool_that_ends_its_process_is_said_as_such_and_exits_are_errors(files):
    workers = ToolWorkers(
        ToolSource("functions", str(files / "tools.py")), workers=1, timeout=5, memory_mb=64, max_chars=40
    )
    try:
        workers.reset([{}])
        (crashed,) = workers.call([(0, "crash", {})])
        assert crashed.text == "error: the tool's process exited during the call" and crashed.seconds == 0.0
        assert workers.restarts == 1
    finally:
        workers.close()


def test_a_tools_file_that_shadows_the_standard_library_does_not_break_the_workers(tmp_path, monkeypatch):
    (tmp_path / "json.py").write_text(textwrap.dedent(TOOLS))  # (named like the module the protocol uses)
    monkeypatch.chdir(tmp_path)  # (the current folder: where a shadowing file would be found first)
    workers = ToolWorkers(
        ToolSource("functions", str(tmp_path / "json.py")), workers=1, timeout=2, memory_mb=64, max_chars=40
    )
    try:
        workers.reset([{}])
        assert workers.call([(0, "add", {"a": 1, "b": 2})])[0].text == "3"
    finally:
        workers.close()
