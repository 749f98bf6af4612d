"""Training on several processes through real Ray Train (a local Ray instance, CPU workers, gloo):
the path GPUs take, on this CPU machine. The data-parallel invariant - N workers x batch b train like
1 worker x batch N*b - holds step for step, for SFT (full and LoRA) and DPO; a 2-worker run resumes
with 1 worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leap_finetune.api import run_config
from tests.conftest import fact_rows, tiny_config, write_config, write_jsonl

STEPS = {"max_steps": 4, "logging_steps": 1, "save_steps": 4, "learning_rate": 2e-3, "warmup_steps": 0}


@pytest.fixture(scope="module")
def ray_cpus():
    """One local Ray instance for the module (its start-up is the slow part); the driver reuses it."""
    import ray

    from leap_finetune.launch.distributed import worker_env

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": worker_env()},
             logging_config=ray.LoggingConfig(log_level="ERROR"))
    yield
    ray.shutdown()


def _losses(summary: dict) -> dict[int, float]:
    records = map(json.loads, (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines())
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def _same(got: dict, expected: dict, rel: float = 1e-4) -> None:
    assert sorted(got) == sorted(expected)
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=rel), (step, got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sft", "sft_lora", "dpo"])
def test_two_workers_train_like_one_worker_with_twice_the_batch(workdir, ray_cpus, kind):
    if kind == "dpo":
        write_jsonl(workdir / "train.jsonl", [{"prompt": f"Say {w} twice.", "chosen": f"{w} {w}", "rejected": "No."}
                                              for w in ["red", "blue", "teal", "gold"] * 6])
        extra = {"training_type": "dpo"}
        training = {"extends": "DEFAULT_DPO", "learning_rate": 1e-3}
    else:
        write_jsonl(workdir / "train.jsonl", fact_rows(48))
        extra = {"peft_config": {"extends": "DEFAULT_LORA", "r": 8, "lora_dropout": 0.0}} if kind == "sft_lora" else {}
        # full: padding-free batches (the GPU default; leap-finetune's token-balanced sampler); LoRA: padded
        # batches (transformers' BatchRebalanceSampler)
        training = {"padding_free": True} if kind == "sft" else {}

    def config(name: str, batch: int, workers: int | None):
        data = tiny_config(project_name=name, **extra,
                           training_config={**STEPS, **training, "per_device_train_batch_size": batch})
        if workers:
            data["ray"] = {"num_workers": workers}
        return write_config(workdir, data, f"{name}.yaml")

    one = run_config(config("one", 8, None))
    two = run_config(config("two", 4, 2))
    _same(_losses(two), _losses(one))
    run_dir = Path(two["run_dir"])
    assert (run_dir / "model" / "config.json").exists() and (run_dir / "checkpoint-4").is_dir()
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == 4
    # rank 0 alone wrote the metrics: each step once
    steps = [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == sorted(set(steps))


@pytest.mark.slow
def test_a_two_worker_run_resumes_with_one_worker(workdir, ray_cpus):
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    constant = {**STEPS, "lr_scheduler_type": "constant", "save_steps": 3}

    def config(name: str, project: str, **training):
        data = tiny_config(project_name=project, training_config={**constant, **training})
        return write_config(workdir, data, f"{name}.yaml")

    reference = run_config(config("ref", "ref", max_steps=6, per_device_train_batch_size=8))
    two_yaml = tiny_config(project_name="switch", training_config={**constant, "max_steps": 3,
                                                                   "per_device_train_batch_size": 4})
    two_yaml["ray"] = {"num_workers": 2}
    run_config(write_config(workdir, two_yaml, "two.yaml"))
    resumed = run_config(config("one", "switch", max_steps=6, per_device_train_batch_size=8,
                                resume_from_checkpoint="latest"))
    _same(_losses(resumed), _losses(reference))


@pytest.mark.slow
def test_a_killed_worker_ends_the_run_with_its_rank_and_leaves_a_resumable_checkpoint(workdir):
    """SIGKILL one Ray Train worker of a real 2-worker CLI run: the run ends (exit 1) with a message
    naming the rank, Ray is shut down (no process left behind), and the last checkpoint resumes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    from leap_finetune.recipes.checkpoints import MARKER, verify

    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    data = tiny_config(project_name="killed", training_config={**STEPS, "max_steps": 400, "save_steps": 3,
                                                               "per_device_train_batch_size": 4})
    data["ray"] = {"num_workers": 2}
    config = write_config(workdir, data)
    before = {p.pid for p in psutil.process_iter()}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "leap_finetune.cli", str(config)], cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 600
    while time.time() < deadline and not list((workdir / "outputs" / "killed").glob(f"*/checkpoint-*/{MARKER}")):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.2)
    workers = [p for p in psutil.process_iter(["cmdline"]) if "RayTrainWorker" in " ".join(p.info["cmdline"] or [])]
    assert workers, "no Ray Train worker process found"
    workers[-1].send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr[-3000:]
    assert "error: worker rank" in stderr and "failed" in stderr and "resume with" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr.split("error: worker rank")[-1]
    time.sleep(2)
    left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
            and any(name in " ".join(p.info["cmdline"] or []) for name in ("raylet", "gcs_server", "RayTrainWorker"))]
    assert not left, [p.info["cmdline"][:2] for p in left]
    [run_dir] = list((workdir / "outputs" / "killed").iterdir())
    marked = [p for p in run_dir.glob("checkpoint-*") if (p / MARKER).exists()]
    assert marked and all(verify(p).ok for p in marked)
    newest = max(int(p.name.split("-")[1]) for p in marked)
    data["training_config"].update(max_steps=newest + 2, resume_from_checkpoint="latest", per_device_train_batch_size=8)
    del data["ray"]
    resumed = run_config(write_config(workdir, data, "resume.yaml"))
    assert resumed["global_step"] == newest + 2
