"""`environment.tools: http://HOST:PORT` (rl/openenv_http.py): an OpenEnv environment server - openenv-core 0.3's own
HTTP server with a FastMCP environment (tests/rl/openenv_server.py), run from .venv/openenv (scripts/setup.sh) on
127.0.0.1 - seen through the tool workers: its tools become the definitions the prompts show, each episode gets a
session of its own (its state is its own), a tool that fails is the model's error text, the sessions are closed when
the episodes end; `validate` reads the tools from the server and says where it is not."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from leap_finetune.rl.openenv_http import ServerError, rpc
from leap_finetune.rl.tool_specs import ToolSource
from leap_finetune.rl.tool_workers import ToolWorkers
from tests.conftest import invoke, write_config, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
OPENENV_PYTHON = ROOT / ".venv" / "openenv" / "bin" / "python"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    assert OPENENV_PYTHON.exists(), "openenv-core's environment is missing: run bash scripts/setup.sh"
    port = _free_port()
    process = subprocess.Popen(
        [str(OPENENV_PYTHON), str(Path(__file__).with_name("openenv_server.py")), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            rpc(url, "tools/list", {}, 2)
            break
        except ServerError:
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the OpenEnv server did not start within 60 s"
            time.sleep(0.2)
    yield url
    process.terminate()
    process.wait(10)


def test_each_episode_has_its_own_session_on_the_server(server):
    workers = ToolWorkers(ToolSource("http", server), workers=2, timeout=10, memory_mb=512, max_chars=200)
    try:
        assert workers.reset([{}, {}, {}]) == [None, None, None]
        wrote = workers.call(
            [(0, "write", {"key": "door", "text": "teal"}), (1, "write", {"key": "door", "text": "red"})]
        )
        assert [o.text for o in wrote] == ["kept door", "kept door"] and all(o.ok for o in wrote)
        read = workers.call([(0, "read", {"key": "door"}), (1, "read", {"key": "door"}), (2, "read", {"key": "door"})])
        assert [o.text for o in read[:2]] == ["teal", "red"]  # (episodes 0 and 2 share a worker, not a session)
        assert not read[2].ok and "door" in read[2].text and read[2].text.startswith("error: ")
    finally:
        workers.end()
        workers.close()


def test_the_sessions_are_closed_when_the_episodes_end(server):
    from leap_finetune.rl.openenv_http import HttpEnvironment

    episode = HttpEnvironment(server, 5)
    episode.reset({})
    session = episode.session
    assert rpc(
        server, "tools/call", {"name": "write", "arguments": {"key": "k", "text": "v"}, "session_id": session}, 5
    )
    episode.close()
    with pytest.raises(ServerError, match="Unknown session_id"):
        rpc(server, "tools/call", {"name": "read", "arguments": {"key": "k"}, "session_id": session}, 5)


def _grpo(tmp_path, tools: str) -> Path:
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Keep 'teal' as the door's color.", "solution": "kept"}] * 8)
    config = {
        "project_name": "openenv",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "environment": {"tools": tools, "max_turns": 2},
        "rewards": ["accuracy"],
        "training_config": {"use_vllm": False, "max_steps": 1, "per_device_train_batch_size": 4,
                            "num_generations": 4, "max_completion_length": 32},
    }  # fmt: skip
    return write_config(tmp_path, config)


def test_validate_reads_the_tools_from_the_server_and_says_where_it_is_not(tmp_path, server):
    result = invoke("validate", str(_grpo(tmp_path, server)))
    assert result.returncode == 0, result.stderr
    assert f"2 tool(s) (write, read) from {server}" in result.stdout + result.stderr
    result = invoke("validate", str(_grpo(tmp_path, f"http://127.0.0.1:{_free_port()}")))
    assert result.returncode == 2 and "did not list its tools" in result.stderr and "start the OpenEnv" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_adapter_needs_only_the_standard_library():
    """The client runs in the tool workers of every run: importing it must not pull openenv-core's stack."""
    code = "import sys, leap_finetune.rl.openenv_http; print(sorted(m for m in ('fastapi', 'fastmcp', 'httpx', 'requests') if m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
    )
