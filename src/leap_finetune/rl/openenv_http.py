"""`environment.tools: http://HOST:PORT` - an OpenEnv environment served over HTTP, as a stateful environment of the
same interface as a Python class (rl/tool_specs.py): one session per episode, its tools the server's.

The protocol is OpenEnv's MCP endpoint (`POST {url}/mcp`, JSON-RPC 2.0; openenv-core's http_server.py):
`tools/list` -> {"tools": [{name, description, inputSchema}]}; `openenv/session/create` -> {"session_id"} (an episode's
own environment on the server); `tools/call` {name, arguments, session_id} -> an MCP CallToolResult ({"content":
[{"type": "text", "text": ...}], "isError": ...}) or a plain value; `openenv/session/close` {session_id}. A server
without sessions (JSON-RPC "method not found" on create) is called without one: each call stands alone.

Why our own client and not openenv-core's: its client pulls FastAPI, FastMCP and Gradio into the training
environment; these four JSON-RPC methods need only the standard library, in the tool workers' processes.
"""

from __future__ import annotations

import itertools
import json
import urllib.error
import urllib.request

from leap_finetune.errors import LeapError

METHOD_NOT_FOUND = -32601
_ids = itertools.count(1)


class ServerError(RuntimeError):
    """The server answered with a JSON-RPC error, or not at all."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


def is_url(value) -> bool:
    return isinstance(value, str) and value.startswith(("http://", "https://"))


def rpc(url: str, method: str, params: dict, timeout: float):
    """One JSON-RPC request to {url}/mcp; its result, or ServerError."""
    body = json.dumps({"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}).encode()
    request = urllib.request.Request(
        url.rstrip("/") + "/mcp",
        data=body,
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        raise ServerError(f"{method}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        raise ServerError(f"{method}: {getattr(err, 'reason', err)}") from None
    answer = _json_of(text)
    if not isinstance(answer, dict):
        raise ServerError(f"{method}: the answer is not a JSON-RPC response: {text[:200]!r}")
    if answer.get("error"):
        error = answer["error"]
        raise ServerError(f"{method}: {error.get('message', error)}", error.get("code"))
    return answer.get("result")


def _json_of(text: str):
    """The response body: JSON, or (streamable HTTP) an event stream whose first `data:` line is the JSON."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        stripped = next((line[5:].strip() for line in text.splitlines() if line.startswith("data:")), "")
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        return None


def server_tools(url: str, where: str, timeout: float = 10.0) -> list[dict]:
    """The server's tools as definitions {name, description, parameters}; a LeapError where it cannot tell."""
    try:
        result = rpc(url, "tools/list", {}, timeout)
    except ServerError as err:
        raise LeapError(
            f"the environment server at {url} did not list its tools ({err})",
            where=where,
            fix="start the OpenEnv environment server first (it answers POST /mcp), and check the URL and port",
        ) from None
    tools = result.get("tools") if isinstance(result, dict) else None
    if not tools:
        raise LeapError(
            f"the environment server at {url} lists no tools", where=where, fix="serve an environment with MCP tools"
        )
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"].isidentifier():
            raise LeapError(
                f"the environment server at {url} lists a tool without a usable name: {str(tool)[:200]}",
                where=where,
                fix="name each tool with a Python identifier (the model calls it as name(key=value))",
            )
        parameters = tool.get("inputSchema") or tool.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"name": tool["name"], "description": tool.get("description") or "", "parameters": parameters})
    return out


class HttpEnvironment:
    """One episode's session on the server (the tool workers make one per episode, as for a class environment)."""

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout, self.session = url, timeout, None

    def reset(self, row: dict) -> None:
        try:
            self.session = rpc(self.url, "openenv/session/create", {}, self.timeout)["session_id"]
        except ServerError as err:
            if err.code != METHOD_NOT_FOUND:
                raise
            self.session = None  # (a server without sessions: every call stands alone)

    def call(self, name: str, arguments: dict):
        params = {"name": name, "arguments": arguments}
        if self.session is not None:
            params["session_id"] = self.session
        result = rpc(self.url, "tools/call", params, self.timeout)
        if isinstance(result, dict) and isinstance(result.get("content"), list):
            text = "\n".join(str(part.get("text", "")) for part in result["content"] if isinstance(part, dict))
            if result.get("isError"):
                raise RuntimeError(text or "the tool failed")
            return text
        return result

    def close(self) -> None:
        if self.session is not None:
            rpc(self.url, "openenv/session/close", {"session_id": self.session}, self.timeout)
            self.session = None
