"""A judge that fails is loud: GRPO against a real HTTP server on 127.0.0.1 that speaks the OpenAI
chat-completions API and can be told to break (HTTP 500, answers without a score, hanging). Before: exit 0,
"reward 0.00 -> 0.00", the failures only in metrics.jsonl, ~180 s per step for a hanging judge, and `validate`
never asked the server anything."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from transformers import TrainerCallback

from leap_finetune.api import run_config, validate_config
from leap_finetune.errors import LeapError
from leap_finetune.runs.checkpoints import verify
from tests.conftest import write_config, write_jsonl
from tests.watchdog import Watchdog, wait_until


class JudgeServer:
    """An OpenAI-compatible judge whose behaviour the test sets: ok ({"score": 7}), error500, garbage, hang."""

    def __init__(self):
        self.mode = "ok"
        self.requests: list[str] = []  # the mode each chat request met
        self.hang_s = 3.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, status: int, value: dict) -> None:
                body = json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path.rstrip("/").endswith("/models"):
                    self._json(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": "judge-model", "object": "model", "created": 0, "owned_by": "test"}],
                        },
                    )
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                mode = outer.mode
                outer.requests.append(mode)
                if mode == "error500":
                    self._json(500, {"error": {"message": "the judge crashed", "type": "server_error"}})
                    return
                if mode == "hang":
                    time.sleep(outer.hang_s)
                content = "I cannot grade this." if mode == "garbage" else '{"score": 7}'
                self._json(
                    200,
                    {
                        "id": "x",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "judge-model",
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                        ],
                    },
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # (a client that timed out closed the socket)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def judge_server():
    server = JudgeServer()
    yield server
    server.server.shutdown()


class Modes(TrainerCallback):
    """The judge's behaviour from a step on: {step: mode}."""

    def __init__(self, server: JudgeServer, modes: dict[int, str]):
        self.server, self.modes = server, modes

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in self.modes:
            self.server.mode = self.modes[state.global_step]


def _config(folder: Path, judge: dict, name: str = "grpo.yaml", **training) -> Path:
    write_jsonl(folder / "prompts.jsonl", [{"prompt": "Name a color.", "solution": "teal"}] * 32)
    config = {
        "project_name": "judged",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": {"funcs": ["accuracy"], "judge": {"model": "judge-model", "timeout_s": 5, "retries": 0, **judge}},
        "training_config": {
            "use_vllm": False,
            "max_steps": 6,
            "per_device_train_batch_size": 16,
            "num_generations": 8,
            "max_completion_length": 4,
            "logging_steps": 1,
            "save_steps": 100,
            "save_total_limit": 3,
            **training,
        },
    }
    return write_config(folder, config, name)


def test_validate_asks_the_judge_for_its_models(workdir, judge_server, capfd):
    with pytest.raises(LeapError, match="does not answer GET /models") as info:
        validate_config(_config(workdir, {"base_url": "http://127.0.0.1:9/v1"}))
    assert info.value.where.endswith("rewards.judge.base_url") and "check_at_validate: false" in info.value.fix
    validate_config(_config(workdir, {"base_url": judge_server.url}))  # up, serving the model: valid
    assert "warning: the judge" not in capfd.readouterr().err
    # a name it does not list: a warning (some servers answer any name, others list aliases)
    validate_config(_config(workdir, {"base_url": judge_server.url, "model": "other"}))
    assert "warning: the judge at " in capfd.readouterr().err


def test_a_judge_that_fails_every_request_stops_the_run_with_a_checkpoint(workdir, judge_server, capfd):
    """HTTP 500 from step 3 on: each step's failures are on the console as they happen, and after
    max_failed_steps (2) the run saves a checkpoint and stops with an error naming the judge and its answer.
    Fixed, the run resumes; its report counts the judge's failures."""
    config = _config(workdir, {"base_url": judge_server.url, "max_failed_steps": 2})
    with pytest.raises(
        LeapError, match=r"the judge at .* failed every request for 2 steps in a row \(last: HTTP 500"
    ) as info:
        run_config(config, callbacks=[Modes(judge_server, {2: "error500"})])
    assert "resume_from_checkpoint: latest" in info.value.fix
    [run_dir] = (workdir / "outputs" / "judged").iterdir()
    assert verify(run_dir / "checkpoint-4").ok
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_early"] and summary["global_step"] == 4
    assert summary["judge"]["failures"] == 32 and summary["judge"]["requests"] == 64
    err = " ".join(capfd.readouterr().err.split())
    assert "step 3: the judge failed 16 of 16 requests (last: HTTP 500 (InternalServerError)" in err, err[-3000:]
    assert "(judge failed 16/16)" in err  # the progress line

    judge_server.mode = "ok"
    resumed = run_config(
        _config(
            workdir,
            {"base_url": judge_server.url, "max_failed_steps": 2},
            "resume.yaml",
            resume_from_checkpoint="latest",
        )
    )
    assert resumed["global_step"] == 6 and resumed["judge"] == {
        "failures": 0,
        "requests": 32,
        "last_failure": None,
        "stop_reason": None,
        "since_step": 4,
    }
    err = " ".join(capfd.readouterr().err.split())
    assert "judge │ 0 of 32 requests failed since the resume at step 4" in err, err[-2500:]


def test_a_judge_that_answers_garbage_or_hangs_costs_one_round_per_step(workdir, judge_server, capfd):
    """Answers without a score, then a judge that hangs: when the first round of a step's requests all time out,
    its other completions are not sent (before: every request waited for its timeout and retries). Failures
    below the limit never stop the run, and its report says how many and why."""
    judge_server.mode = "garbage"
    judge_server.hang_s = 2.0
    config = _config(
        workdir,
        {"base_url": judge_server.url, "max_concurrency": 4, "timeout_s": 0.5, "max_failed_steps": 4},
        max_steps=4,
    )
    summary = run_config(config, callbacks=[Modes(judge_server, {1: "hang", 3: "ok"})])
    assert summary["global_step"] == 4
    # step 1: 16 answers without a score (the judge is up: every completion is sent); steps 2-3: the first round
    # of 4 times out, the other 12 are not sent; step 4: all 16
    assert judge_server.requests == ["garbage"] * 16 + ["hang"] * 8 + ["ok"] * 16
    assert summary["judge"]["failures"] == 48 and summary["judge"]["requests"] == 64
    err = " ".join(capfd.readouterr().err.split())
    assert "step 1: the judge failed 16 of 16 requests (last: an answer without a score: 'I cannot grade this.')" in err
    assert "step 2: the judge failed 16 of 16 requests (last: APITimeoutError" in err
    assert "judge │ 48 of 64 requests failed (scored failure_score; last: APITimeoutError" in err


def test_a_second_ctrl_c_does_not_wait_for_a_hanging_judge(workdir, judge_server):
    """A judge that hangs: the first Ctrl-C asks for a checkpoint after the step, which waits for the judge; the
    second stops at once (it waited for every request in flight to time out)."""
    import os
    import signal

    from leap_finetune import signals
    from leap_finetune.signals import Stopped

    judge_server.mode, judge_server.hang_s = "hang", 12.0
    config = _config(workdir, {"base_url": judge_server.url, "timeout_s": 12, "max_failed_steps": 0}, max_steps=3)
    second, errors = [], []

    def interrupt():
        try:
            wait_until(lambda: judge_server.requests, Watchdog(os.getpid(), what="the run"))
        except AssertionError as err:  # (a thread's exception would be lost: the test reports it)
            errors.append(err)
            return
        os.kill(os.getpid(), signal.SIGINT)  # (run_config's handlers, in this process's main thread)
        # Within 2 s of the first signal's *handling* the same signal counts as one event delivered twice; the
        # main thread runs the handler only between bytecodes, late on a loaded machine: wait for it to have run.
        try:
            wait_until(lambda: signals._state.received is not None, Watchdog(os.getpid(), what="the run"))
        except AssertionError as err:
            errors.append(err)
            return
        time.sleep(signals.SAME_EVENT_S + 0.5)
        second.append(time.time())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(Stopped) as info:
        run_config(config)
    assert not errors, errors
    assert info.value.at_once and time.time() - second[0] < 3, time.time() - second[0]
