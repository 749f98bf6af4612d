"""`eval --server` on a tool_call benchmark, against a small OpenAI-compatible HTTP server started here on 127.0.0.1
that answers as a server with a tool parser would, and fails on one row as a parser that cannot read an answer
does (HTTP 500): the request carries the row's tools in OpenAI's form, the returned tool_calls are scored, a failed
row is counted and reported without stopping the benchmark, and calls left in the text are flagged. A server that
refuses tools (vLLM without --enable-auto-tool-choice) is an error that says how to serve it.
(tests/e2e/test_tool_calling_example.py runs the same path against a real `transformers serve`.)"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.evaluation.standalone import evaluate_config
from tests.conftest import write_config, write_jsonl

TOOL = {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}
CITIES = ["Oslo", "Lima", "Rome", "Kyiv"]


def _answer(city: str) -> dict:
    """What the server returns for a question about `city`."""
    if city == "Oslo":  # parsed by its parser
        return {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Oslo"})}}]}  # fmt: skip
    if city == "Lima":  # a wrong argument
        return {"role": "assistant", "content": "", "tool_calls": [{"id": "1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Quito"})}}]}  # fmt: skip
    return {"role": "assistant", "content": f'[get_weather(city="{city}")]'}  # left in the text (Kyiv)


class _Handler(BaseHTTPRequestHandler):
    requests: list = []
    refuse_tools = False
    garbage = False

    def log_message(self, *args):  # (quiet)
        pass

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "served", "object": "model", "owned_by": "test"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if type(self).garbage:  # (200 with something that is not a chat completion)
            self._send(200, {"hello": "world"})
            return
        if type(self).refuse_tools and body.get("tools"):
            self._send(400, {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}})
            return
        city = next(c for c in CITIES if c in body["messages"][-1]["content"])
        if city == "Rome":
            self._send(500, {"error": {"message": "python-call-list: expected a string at position 18"}})
            return
        self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": "served", "choices": [
            {"index": 0, "message": _answer(city), "finish_reason": "tool_calls"}]})  # fmt: skip


@pytest.fixture
def server():
    _Handler.requests, _Handler.refuse_tools, _Handler.garbage = [], False, False
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def _config(workdir):
    rows = [{"tools": [TOOL], "messages": [{"role": "user", "content": f"Weather in {city}?"}, {"role": "assistant",
             "content": f'<|tool_call_start|>[get_weather(city="{city}")]<|tool_call_end|>'}]} for city in CITIES]  # fmt: skip
    write_jsonl(workdir / "calls.jsonl", rows)
    return write_config(
        workdir,
        {"model_name": "tiny-lfm2", "evals": {"batch_size": 1, "benchmarks": [
            {"name": "calls", "path": "calls.jsonl", "metric": "tool_call"}]}},
    )  # fmt: skip


def test_the_servers_tool_calls_are_scored_and_its_failures_counted(workdir, server, capsys):
    results = evaluate_config(_config(workdir), output=workdir / "r.json", server=server)["results"]
    # every request carried the row's tools, wrapped as OpenAI's; the 500 was retried once by the client (its one
    # retry: evaluation/server.py)
    assert [r["tools"] for r in _Handler.requests] == [[{"type": "function", "function": TOOL}]] * 5
    assert results["benchmark/calls/rows"] == 4
    assert results["benchmark/calls/exact"] == 0.25  # Oslo only
    assert results["benchmark/calls/server_tool_calls"] == 2
    assert results["benchmark/calls/calls_in_text"] == 1 and results["benchmark/calls/server_errors"] == 1
    rows = [json.loads(line) for line in (workdir / "r.predictions" / "calls.jsonl").read_text().splitlines()]
    by_city = {city: row for city, row in zip(CITIES, rows)}
    assert by_city["Oslo"]["tool_calls"] == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    assert by_city["Lima"]["argument_f1"] == 0.0 and by_city["Lima"]["name"] == 1.0
    assert by_city["Rome"]["server_error"].startswith("InternalServerError") and by_city["Rome"]["parsed"] == 0.0
    assert by_city["Kyiv"]["calls_in_text"] is True and by_city["Kyiv"]["score"] == 0.0
    err = capsys.readouterr().err
    assert "returned tool calls as text in 1 of 4" in err and "failed on 1 of 4" in err


def test_a_server_that_refuses_tools_says_how_to_serve(workdir, server):
    _Handler.refuse_tools = True
    with pytest.raises(LeapError) as info:
        evaluate_config(_config(workdir), server=server)
    message = info.value.format()
    assert "--enable-auto-tool-choice --tool-call-parser lfm2" in message and "calls.jsonl, line 1" in message


def test_tool_definitions_go_in_openai_form_and_calls_in_text_are_found_anywhere():
    from leap_finetune.data.tool_call_score import calls_in_text
    from leap_finetune.evaluation.server import openai_tools

    wrapped = {"type": "function", "function": TOOL}
    assert openai_tools([TOOL, wrapped, {"function": TOOL}, json.dumps(TOOL)]) == [wrapped] * 4
    assert calls_in_text('Sure. [get_weather(city="Oslo")] Done.')
    assert not calls_in_text("See [1] and [note(s)] for details")


def test_vllm_evaluation_servers_get_lfms_tool_parser_for_tool_benchmarks(workdir):
    from leap_finetune.evaluation.server import vllm_tool_flags
    from leap_finetune.validate.loader import load_config

    flags = vllm_tool_flags(load_config(_config(workdir)))
    assert flags == ["--enable-auto-tool-choice", "--tool-call-parser", "lfm2"]
    plain = write_config(workdir, {"model_name": "tiny-lfm2", "evals": {"benchmarks": [
        {"name": "calls", "path": "calls.jsonl", "metric": "exact_match"}]}}, name="plain.yaml")  # fmt: skip
    assert vllm_tool_flags(load_config(plain)) == []


def test_async_evals_dtype_and_context_reach_the_vllm_server(workdir):
    """async_eval.dtype / max_model_len are the evaluation server's --dtype / --max-model-len (sidecar's job script
    and reserved's server both take vllm_server_flags); unset, vLLM's own defaults."""
    from leap_finetune.evaluation.server import vllm_server_flags
    from leap_finetune.validate.loader import load_config

    bench = {"benchmarks": [{"name": "calls", "path": "calls.jsonl", "metric": "tool_call"}]}
    _config(workdir)
    sized = write_config(workdir, {"model_name": "tiny-lfm2", "evals": bench, "async_eval": {
        "mode": "reserved", "dtype": "float16", "max_model_len": 2048}}, name="sized.yaml")  # fmt: skip
    assert vllm_server_flags(load_config(sized)) == [
        "--enable-auto-tool-choice", "--tool-call-parser", "lfm2", "--dtype", "float16", "--max-model-len", "2048"
    ]  # fmt: skip
    plain = write_config(workdir, {"model_name": "tiny-lfm2", "evals": bench, "async_eval": {"mode": "reserved"}},
                         name="plain.yaml")  # fmt: skip
    assert "--dtype" not in vllm_server_flags(load_config(plain))


def test_a_server_that_answers_no_chat_completion_is_a_clear_error(workdir, server):
    _Handler.garbage = True
    with pytest.raises(LeapError) as info:
        evaluate_config(_config(workdir), server=server)
    assert "not a chat completion" in info.value.format()
    with pytest.raises(LeapError) as info:  # a base URL without its scheme
        evaluate_config(_config(workdir), server=server.removeprefix("http://"))
    assert "http://127.0.0.1" in info.value.format()
