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
    message = info.value.format()
    assert "did not list its models" in message and "vllm serve" in message
