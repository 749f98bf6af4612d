"""The runs the async_eval tests compare (tests/evaluation/test_async_eval*.py): the config of a tiny run with two
benchmarks in a given mode, the benchmark results and failures a run logged by step, and the sync run every mode's
results are held to (one core for training, as a trainer and its evaluator each have their own on a cluster)."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from leap_finetune.api import run_config
from tests.conftest import EXAMPLES, tiny_config, write_config

# 12 rows answered one at a time: an evaluation that costs seconds on this CPU (sync mode pauses for it).
BENCH = {
    "max_new_tokens": 32,
    "batch_size": 1,
    "eval_steps": 3,
    "benchmarks": [
        {"name": "capitals", "path": "bench.jsonl", "metric": "exact_match"},
        {"name": "mcq", "path": "mcq.jsonl", "metric": "logprob_mcq"},
    ],
}


def async_config(folder: Path, mode: str, name: str, evals: dict | None = None, **async_eval) -> Path:
    for source, target in (
        ("quickstart.jsonl", "train.jsonl"),
        ("quickstart_bench_generation.jsonl", "bench.jsonl"),
        ("quickstart_bench_mcq.jsonl", "mcq.jsonl"),
    ):
        shutil.copy(EXAMPLES / "data" / source, folder / target)
    config = tiny_config(
        training_config={"max_steps": 12, "per_device_train_batch_size": 8, "learning_rate": 3e-3, "save_steps": 100},
        evals={**BENCH, **(evals or {})},
        async_eval={"mode": mode, "vllm_gpus": 0, **async_eval},
    )
    return write_config(folder, config, name)


def scores_by_step(run_dir: Path) -> dict[int, dict]:
    """Benchmark results by the training step they belong to, from metrics.jsonl (timings left out)."""
    found: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        scores = {
            k: v
            for k, v in record.items()
            if k.startswith("benchmark/") and not k.endswith("/seconds") and k != "benchmark/failures"
        }
        if scores:
            assert record["step"] not in found, f"step {record['step']} logged twice"
            found[record["step"]] = scores
    return found


def failures_by_step(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["benchmark/failures"] for r in records if "benchmark/failures" in r}


@pytest.fixture(scope="module", autouse=True)
def one_core_each():
    """Training (in this process) uses one core and a CPU evaluator the other, as a trainer and its evaluation
    job each have their own resources on a cluster: on 2 cores, torch's two training threads stall at every
    parallel region whenever any other process is scheduled, which would measure this machine, not the mode."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sync")
    summary = run_config(async_config(folder, "sync", "sync.yaml"), outputs_root=folder / "outputs")
    return summary, scores_by_step(Path(summary["run_dir"]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
