"""`leap-finetune eval --server` against a server that lists its models and then never answers a chat completion
fails after one row's wait (--server-timeout, asked twice), not after the requests already under way have also
timed out: was 86 s with --server-timeout 20 (the ThreadPoolExecutor's workers were joined when its `with` block
ended, and again when the interpreter exited), silent after the last progress line."""

from __future__ import annotations

import http.server
import json
import threading
import time

from tests.conftest import chat, run_cli, write_config, write_jsonl

TIMEOUT_S = 4  # --server-timeout
RETRY_BACKOFF_S = 0.5  # the openai client's wait before its one retry (at most)


class _Mute:
    """On 127.0.0.1: lists one model at once, accepts every chat completion and never answers it."""

    def __init__(self):
        self.posts: list[float] = []  # when each chat completion arrived (time.monotonic)
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                data = json.dumps({"object": "list", "data": [{"id": "mute", "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                server.posts.append(time.monotonic())
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.release.wait(120)

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


def test_a_server_that_never_answers_fails_after_one_rows_wait_not_after_every_running_request(workdir):
    # 6 rows, 2 at a time: when the first two time out, the next two are already sent
    write_jsonl(workdir / "bench.jsonl", [chat(f"Capital of country {i}?", "Paris") for i in range(6)])
    bench = {"name": "qa", "path": "bench.jsonl", "metric": "exact_match"}
    config = write_config(workdir, {"model_name": "tiny-lfm2", "evals": {"batch_size": 2, "benchmarks": [bench]}})
    with _Mute() as server:
        result = run_cli(
            "eval", str(config), "--server", server.url, "--server-timeout", str(TIMEOUT_S), cwd=workdir, cpu_s=300
        )
        ended = time.monotonic()
    assert result.returncode == 2, result.stderr
    text = " ".join(result.stderr.split())
    assert "did not answer benchmark 'qa'" in text and f"within {TIMEOUT_S} s, twice" in text, text
    assert "Traceback" not in result.stderr
    # Timed from the first request the server took (the CLI's start-up is not counted): one row's wait is its two
    # tries; a second wave of requests would add as much again (measured here: ~9 s after the fix, ~18 s before).
    one_row = 2 * TIMEOUT_S + RETRY_BACKOFF_S
    took = ended - server.posts[0]
    assert one_row * 0.9 < took < one_row * 1.6, (took, one_row)
