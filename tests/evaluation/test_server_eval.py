"""`leap-finetune eval --server URL`: a real `transformers serve` on 127.0.0.1 answers the generation
benchmarks through its chat completions endpoint; greedy answers (and so the scores) equal the ones the
model gives through transformers in this process. A server that does not answer is a clear error."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.evaluation.standalone import evaluate_config
from tests.conftest import write_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    import torch

    from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

    folder = tmp_path_factory.mktemp("tiny") / "model"
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    model = build_tiny_model("tiny-lfm2", tokenizer)
    # larger random weights: greedy answers of varied tokens (the built-in weights answer blank lines)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_generation_benchmarks_through_a_server_score_like_local_generation(workdir, tiny_model):
    from leap_finetune.runs.processes import ServerSpec, running

    shutil.copy(EXAMPLES / "data" / "quickstart_bench_generation.jsonl", workdir / "bench.jsonl")
    config = write_config(
        workdir,
        {
            "model_name": str(tiny_model),
            "chat_template": "model",
            "evals": {
                "max_new_tokens": 6,
                "batch_size": 4,
                "benchmarks": [{"name": "capitals", "path": "bench.jsonl", "metric": "exact_match", "limit": 6}],
            },
        },
    )
    local = evaluate_config(config, output=workdir / "local" / "results.json")
    port = _free_port()
    spec = ServerSpec(
        name="eval server",
        port=port,
        env={"CUDA_VISIBLE_DEVICES": ""},
        command=[
            sys.executable,
            "-m",
            "transformers.cli.transformers",
            "serve",
            str(tiny_model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
        ],
    )
    with running([spec], workdir / "logs"):
        remote = evaluate_config(
            config, output=workdir / "remote" / "results.json", server=f"http://127.0.0.1:{port}/v1"
        )
    assert remote["server"] == f"http://127.0.0.1:{port}/v1" and remote["model"]
    assert remote["results"]["benchmark/capitals/rows"] == 6

    def answers(folder: str) -> list[str]:
        import json

        path = workdir / folder / "results.predictions" / "capitals.jsonl"
        return [json.loads(line)["prediction"] for line in path.read_text().splitlines()]

    assert answers("remote") == answers("local") and any(answers("local"))
    assert remote["results"]["benchmark/capitals/score"] == local["results"]["benchmark/capitals/score"]
    log = (workdir / "logs" / "eval_server.log").read_text()
    assert log.count("POST /v1/chat/completions") == 6


def test_a_server_that_does_not_answer_is_a_clear_error(workdir, tiny_model):
    shutil.copy(EXAMPLES / "data" / "quickstart_bench_generation.jsonl", workdir / "bench.jsonl")
    config = write_config(
        workdir,
        {
            "model_name": str(tiny_model),
            "evals": {"benchmarks": [{"name": "capitals", "path": "bench.jsonl", "metric": "exact_match"}]},
        },
    )
    with pytest.raises(LeapError) as info:
        evaluate_config(config, server=f"http://127.0.0.1:{_free_port()}/v1")
    message = " ".join(info.value.format().split())
    assert "the connection was refused (no server listens there)" in message and "vllm serve" in message
    assert "fix: start the server, or check the host and port" in message


class _Broken:
    """A server on 127.0.0.1 that is broken the ways real ones are: it lists its models at once, then answers each
    chat completion after `delay` seconds (None: it never answers); with `silent` it accepts the connection and says
    nothing at all."""

    def __init__(self, delay: float | None, silent: bool = False):
        import http.server
        import json
        import threading
        import time

        self.release = threading.Event()
        release = self.release

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if silent:
                    release.wait(30)
                    return
                self._json({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if delay is None:
                    release.wait(30)
                    return
                time.sleep(delay)
                message = {"role": "assistant", "content": "Paris"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                self._json({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice]})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def _bench_config(workdir, tiny_model, rows: int = 4):
    shutil.copy(EXAMPLES / "data" / "quickstart_bench_generation.jsonl", workdir / "bench.jsonl")
    bench = {"name": "capitals", "path": "bench.jsonl", "metric": "exact_match", "limit": rows}
    return write_config(workdir, {"model_name": str(tiny_model), "evals": {"batch_size": 2, "benchmarks": [bench]}})


def test_a_server_that_never_answers_fails_within_the_timeout_naming_it(workdir, tiny_model):
    """Was: nothing printed for up to ~30 minutes (600 s per request, two retries)."""
    import time

    config = _bench_config(workdir, tiny_model)
    for silent, expected in ((True, "accepted the connection but did not answer within 1 s"), (False, "within 1 s")):
        with _Broken(delay=None, silent=silent) as server:
            start = time.monotonic()
            with pytest.raises(LeapError) as info:
                evaluate_config(config, server=server.url, server_timeout=1)
            took = time.monotonic() - start
        message = info.value.format()
        assert expected in message and server.url in message and "--server" in message, message
        assert took < 20, took
    assert "benchmark 'capitals'" in message and "raise --server-timeout" in message


def test_a_slow_server_shows_progress_and_a_model_it_does_not_serve_is_named(workdir, tiny_model, capfd, monkeypatch):
    from leap_finetune.evaluation import server as served

    monkeypatch.setattr(served, "PROGRESS_EVERY_S", 0.2)
    config = _bench_config(workdir, tiny_model, rows=6)
    with _Broken(delay=0.3) as server:
        report = evaluate_config(config, server=server.url)
        assert report["model"] == "served-model" and report["results"]["benchmark/capitals/rows"] == 6
        err = capfd.readouterr().err
        assert "benchmark 'capitals': " in err and f"/6 answered by {server.url}" in err, err
        with pytest.raises(LeapError) as info:
            evaluate_config(config, server=server.url, server_model="nope")
    message = info.value.format()
    assert "--server-model is 'nope', but the server at" in message and "'served-model'" in message, message
