"""An OpenEnv environment server for the tests (run with .venv/openenv's python: openenv-core, FastMCP, uvicorn):
a notebook per session - `write(key, text)` keeps a note, `read(key)` gives it back - so a test can tell that each
episode has its own session. `python openenv_server.py PORT`."""

import sys
from typing import Any

import uvicorn
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State


class Notebook(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("notebook")
        notes: dict[str, str] = {}

        @mcp.tool
        def write(key: str, text: str) -> str:
            """Keep a note.

            Args:
                key: the note's name
                text: what to keep
            """
            notes[key] = text
            return f"kept {key}"

        @mcp.tool
        def read(key: str) -> str:
            """Read a note back.

            Args:
                key: the note's name
            """
            return notes[key]

        super().__init__(mcp)
        self._state = State(episode_id="0", step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0)

    def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
        return Observation(done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(Notebook, CallToolAction, CallToolObservation, env_name="notebook", max_concurrent_envs=64)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
