"""The device plan: counts in, device indices out, every impossible plan an error with the numbers;
and `leap-finetune plan` (text and --json) for machines and clusters the test is not on."""

from __future__ import annotations

import json
import time

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.launch.devices import plan_devices
from tests.conftest import fact_rows, hub_cache_with_tiny_model, invoke, tiny_config, write_config, write_jsonl


@pytest.mark.parametrize("gpus", range(1, 9))
@pytest.mark.parametrize("nodes", [1, 2])
def test_every_gpu_trains_by_default(gpus, nodes):
    plan = plan_devices(gpus=gpus, nodes=nodes)
    assert plan.training == list(range(gpus)) and plan.server == plan.judge == plan.eval == []
    assert plan.workers == gpus * nodes
    assert plan.in_process == (gpus == 1 and nodes == 1) and plan.backend == "nccl"


def test_servers_come_first_then_training_gets_the_rest():
    plan = plan_devices(gpus=8, server=1, judge=1, eval_gpus=2)
    assert (plan.server, plan.judge, plan.eval, plan.training) == ([0], [1], [2, 3], [4, 5, 6, 7])
    plan = plan_devices(gpus=4, server=1, judge=1)
    assert (plan.server, plan.judge, plan.training, plan.workers) == ([0], [1], [2, 3], 2)
    assert plan_devices(gpus=8, server=1, training=3).training == [1, 2, 3]
    # one training GPU of several: a process of its own that sees only that GPU (launch/single.py)
    plan = plan_devices(gpus=2, judge=1)
    assert (plan.judge, plan.training, plan.in_process, plan.own_process) == ([0], [1], True, True)
    assert plan_devices(gpus=2, num_workers=1).own_process and not plan_devices(gpus=1).own_process


def test_cpu_workers():
    assert plan_devices(gpus=0).in_process
    plan = plan_devices(gpus=0, num_workers=2)
    assert (plan.workers, plan.backend, plan.in_process, plan.training) == (2, "gloo", False, [])


@pytest.mark.parametrize(
    ("counts", "message"),
    [
        (
            dict(gpus=8, server=1, judge=1, training=7),
            "the plan needs 9 GPU(s): 1 for the rollout server "
            "(grpo_rollout.server_gpus), 1 for the judge (grpo_rollout.judge_gpus), 7 for training (grpo_rollout.training_gpus); "
            "8 are visible",
        ),
        (dict(gpus=8, server=1, judge=1, training=7), "set grpo_rollout.training_gpus to 6 or fewer"),
        (
            dict(gpus=2, server=1, judge=1),
            "the plan needs 3 GPU(s): 1 for the rollout server (grpo_rollout.server_gpus), 1 "
            "for the judge (grpo_rollout.judge_gpus), at least 1 for training; 2 are visible",
        ),
        (dict(gpus=4, nodes=2, server=1), "single-node only"),
        (dict(gpus=0, server=1), "no GPU is visible"),
        (dict(gpus=2, num_workers=3), "ray.num_workers is 3, but the plan has 2 training GPU(s)"),
        (dict(gpus=2, nodes=2, num_workers=5), "(2 on each of 2 nodes)"),
        (dict(gpus=1, fsdp=True), "fsdp shards the model over several workers, but the plan has 1"),
        (dict(gpus=0, fsdp=True), "fsdp shards the model over several workers"),
        (dict(gpus=0, num_workers=2, fsdp=True), "fsdp shards the model over GPU workers, but no GPU is visible"),
    ],
)
def test_impossible_plans_say_the_numbers(counts, message):
    with pytest.raises(LeapError) as info:
        plan_devices(**counts)
    assert message in info.value.format()


@pytest.mark.parametrize(
    ("counts", "needed", "ways"),
    [
        (dict(gpus=1, server=1, judge=1), 3, ["vllm_mode: colocate", "grpo_rollout.judge_gpus: 0"]),
        (dict(gpus=2, server=2, judge=1), 4, ["vllm_mode: colocate", "grpo_rollout.judge_gpus: 0"]),
        (dict(gpus=2, server=1, eval_gpus=2), 4, ["vllm_mode: colocate", "async_eval.vllm_gpus: 0"]),
        (dict(gpus=1, eval_gpus=1, training=2), 3, ["async_eval.mode: sidecar"]),
    ],
)
def test_more_reserved_than_visible_says_each_part_and_what_to_change(counts, needed, ways):
    """Was "... + -1 training GPU(s), but 2 are visible": servers taking more GPUs than the node has."""
    with pytest.raises(LeapError) as info:
        plan_devices(**counts)
    text = info.value.format()
    assert f"the plan needs {needed} GPU(s)" in text and "-1" not in text, text
    assert f"--gpus {needed}" in text and all(way in text for way in ways), text


@pytest.fixture
def config(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(40))
    return write_config(
        workdir, tiny_config(training_config={"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2})
    )


def test_plan_json_for_a_machine_we_are_not_on(config, workdir):
    result = invoke("plan", str(config), "--gpus", "4", "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["nodes"] == 1 and plan["workers"] == 4
    assert plan["devices"] == {"server": [], "judge": [], "eval": [], "teacher": [], "training": [0, 1, 2, 3]}
    assert plan["batch"] == {
        "per_device": 4,
        "gradient_accumulation_steps": 2,
        "workers": 4,
        "global": 32,
        "global_is_mean": False,
        "unit": "rows",
        "detail": "",
    }
    assert plan["steps_per_epoch"] == 2 and plan["rows"] == 40
    workers = [p for p in plan["processes"] if p["name"].startswith("training worker")]
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in workers] == ["0", "1", "2", "3"]
    assert all(p["env"]["NCCL_NVLS_ENABLE"] == "0" for p in plan["processes"][1:])

    two_nodes = json.loads(invoke("plan", str(config), "--gpus", "2", "--nodes", "2", "--json", cwd=workdir).stdout)
    assert two_nodes["workers"] == 4 and [p["node"] for p in two_nodes["processes"] if "rank" in p["name"]] == [
        0,
        0,
        1,
        1,
    ]
    one = json.loads(invoke("plan", str(config), "--gpus", "1", "--json", cwd=workdir).stdout)
    memory = one["processes"][0].pop("memory")  # (the predicted peak of the one training process: tests/memory/)
    assert one["in_process"] and one["processes"] == [
        {
            "name": "train",
            "node": 0,
            "command": ["leap-finetune", "run", str(config)],
            "env": {"CUDA_VISIBLE_DEVICES": "0"},
        }
    ]
    assert memory["peak_gib"] > 0 and all(p["memory"] == memory for p in workers)  # (each DDP worker the same)
    text = " ".join(invoke("plan", str(config), "--gpus", "2", cwd=workdir).stdout.split())  # (rich wraps lines)
    assert "workers: 2 on 1 node(s) - Ray Train, nccl, a local Ray instance; gradients all-reduced in fp32" in text
    assert "16 rows per step" in text
    assert plan["gradient_all_reduce"] == "fp32" and one["gradient_all_reduce"] is None
    bf16 = write_config(workdir, tiny_config(training_config={"gradient_communication": "bf16"}), "bf16.yaml")
    text = " ".join(invoke("plan", str(bf16), "--gpus", "2", cwd=workdir).stdout.split())
    assert "workers: 2 on 1 node(s) - Ray Train, nccl, a local Ray instance; gradients all-reduced in bf16" in text
    one_process = " ".join(invoke("plan", str(bf16), "--gpus", "1", cwd=workdir).stdout.split())
    assert "gradient_communication: bf16 does nothing here (one process: no all-reduce)" in one_process
    kahan = write_config(workdir, tiny_config(training_config={"optimizer_precision": "bf16_kahan"}), "kahan.yaml")
    text = " ".join(invoke("plan", str(kahan), "--gpus", "2", cwd=workdir).stdout.split())
    assert "gradients all-reduced in bf16 (the weights are bf16)" in text  # (no hook needed, none claimed)


def test_a_reserved_evaluation_gpu_is_taken_out_of_training_before_anything_starts(workdir, config):
    (workdir / "bench.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}\n'
    )
    data = tiny_config(
        evals={"eval_steps": 3, "benchmarks": [{"name": "hi", "path": "bench.jsonl", "metric": "exact_match"}]},
        async_eval={"mode": "reserved", "vllm_gpus": 1, "reserved": {"server_port": 8123}},
    )
    result = invoke("plan", str(write_config(workdir, data, "reserved.yaml")), "--gpus", "4", "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["devices"]["eval"] == [0] and plan["devices"]["training"] == [1, 2, 3] and plan["workers"] == 3
    [server] = [p for p in plan["processes"] if p["name"].startswith("evaluation server")]
    assert server["env"]["CUDA_VISIBLE_DEVICES"] == "0" and "8123" in server["command"]
    assert server["command"][0] == "python" and "before training, every 3 steps and after training" in server["name"]
    data_cpu = {**data, "async_eval": {"mode": "reserved", "vllm_gpus": 0}}
    cpu = json.loads(invoke("plan", str(write_config(workdir, data_cpu, "cpu.yaml")), "--json", cwd=workdir).stdout)
    [server] = [p for p in cpu["processes"] if p["name"].startswith("evaluation server")]
    assert server["command"][:3] == ["nice", "-n", "19"]  # a CPU evaluator yields to training
    workers = [p for p in plan["processes"] if p["name"].startswith("training worker")]
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in workers] == ["1", "2", "3"]
    two_nodes = invoke(
        "plan", str(write_config(workdir, data, "reserved.yaml")), "--gpus", "4", "--nodes", "2", cwd=workdir
    )
    assert two_nodes.returncode == 2 and "async_eval mode: sidecar" in " ".join(two_nodes.stderr.split())


def test_plan_errors_exit_2(workdir, config):
    data = tiny_config(training_config={"per_device_train_batch_size": 4}, ray={"num_workers": 3})
    result = invoke("plan", str(write_config(workdir, data, "three.yaml")), "--gpus", "2", cwd=workdir)
    assert result.returncode == 2 and "ray.num_workers is 3, but the plan has 2 training GPU(s)" in result.stderr


def test_a_ray_address_that_does_not_answer_is_an_error_in_bounded_time(workdir):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    data = tiny_config(ray={"address": f"127.0.0.1:{port}", "connect_timeout_s": 5})
    start = time.monotonic()
    for command in ("validate", "run"):
        result = invoke(command, str(write_config(workdir, data)), cwd=workdir)
        assert result.returncode == 2 and f"the Ray cluster at 127.0.0.1:{port} does not answer" in result.stderr
    assert time.monotonic() - start < 30
    assert not (workdir / "outputs").exists()


def test_resources_per_worker_that_ray_would_refuse_or_wait_for_are_errors_before_ray_starts(workdir, config):
    """`{CPU: -1}` and `{TPU: 1}` passed validate, then Ray failed with a traceback; a resource the local Ray
    instance does not have, or more than it has, made Ray Train wait without end."""
    import os

    cores = os.cpu_count()
    for resources, message, fix in (
        ({"CPU": -1}, "ray.resources_per_worker.CPU is -1: expected a finite number >= 0", "such as 1"),
        ({"CPU": float("nan")}, "ray.resources_per_worker.CPU is .nan", "such as 1"),
        ({"CPU": True}, "ray.resources_per_worker.CPU is true", "such as 1"),
        ({"memory": -1.0}, "ray.resources_per_worker.memory is -1.0", "a number of bytes"),
        ({"TPU": 1}, "ray.resources_per_worker.TPU: Ray Train reserves TPUs only for its TPU runs", "remove TPU"),
        ({"cpu": 1}, "Ray's resource names are case-sensitive, and 'cpu' would be a custom resource", "write CPU"),
        ({"GPU": 1}, "ray.resources_per_worker.GPU is 1, and the plan has CPU workers", "remove GPU"),
        ({"CPU": 0}, "reserves nothing for a worker (every amount is 0)", "CPU: 1"),
        (
            {"my_res": 1},
            "asks for my_res, and the run would start a local Ray instance on this machine, with CPU, GPU "
            "and memory only",
            "--resources='{\"my_res\": N}'",
        ),
        (
            {"CPU": cores},
            f"the plan's 2 workers, each reserving CPU {cores} (ray.resources_per_worker), do not fit in "
            f"a local Ray instance on this machine (CPU {cores}): 1 would",
            "ray.num_workers: 1",
        ),
    ):
        data = tiny_config(ray={"num_workers": 2, "resources_per_worker": resources})
        result = invoke("validate", str(write_config(workdir, data, "ray.yaml")), cwd=workdir)
        text = " ".join(result.stderr.split())
        assert result.returncode == 2 and message in text and fix in text.split("fix:")[-1], (resources, text)
        assert "Traceback" not in result.stderr
    plans = (
        (["--gpus", "8"], {"GPU": 2}, "the plan's 8 workers, each reserving GPU 2", "ray.num_workers: 4"),
        (["--gpus", "2"], {"GPU": 0.5}, "GPU is 0.5: each data-parallel worker trains on a GPU of its own", "GPU: 1"),
    )
    for gpus, resources, message, fix in plans:
        data = tiny_config(ray={"resources_per_worker": resources})
        result = invoke("plan", str(write_config(workdir, data, "gpus.yaml")), *gpus, cwd=workdir)
        text = " ".join(result.stderr.split())
        assert result.returncode == 2 and message in text and fix in text, text
    fits = tiny_config(ray={"resources_per_worker": {"CPU": 1, "memory": 1e9}})
    assert invoke("plan", str(write_config(workdir, fits, "fits.yaml")), "--gpus", "4", cwd=workdir).returncode == 0
    assert not (workdir / "outputs").exists()


def test_plan_loads_no_model_and_counts_tokens_only_with_the_tokenizer_at_hand(workdir):
    """The tokenizer of a Hub model in the cache counts tokens; not there, every row is still checked and counted
    (through the mix of sources and the held-out split), and the plan says why tokens are not."""
    write_jsonl(workdir / "a.jsonl", fact_rows(30))
    write_jsonl(workdir / "b.jsonl", fact_rows(10))
    cache = hub_cache_with_tiny_model(workdir / "hub", "leap-test/tiny-cached")
    data = tiny_config(
        model_name="leap-test/tiny-cached",
        dataset=[{"path": "a.jsonl", "weight": 1, "test_size": 5}, {"path": "b.jsonl", "weight": 1}],
    )
    cached = {**data, "training_config": {**data["training_config"], "model_init_kwargs": {"cache_dir": str(cache)}}}
    counted = invoke("plan", str(write_config(workdir, cached, "cached.yaml")), "--gpus", "2", "--json")
    assert counted.returncode == 0, counted.stderr
    counted = json.loads(counted.stdout)
    assert counted["tokens_per_step"] > 0 and counted["tokens_not_counted"] is None
    # the same model, not in the cache (HF_HUB_OFFLINE=1 in the tests: never downloaded)
    plain = invoke("plan", str(write_config(workdir, data, "plain.yaml")), "--gpus", "2", "--json")
    assert plain.returncode == 0, plain.stderr
    plain = json.loads(plain.stdout)
    assert plain["tokens_per_step"] is None
    assert plain["tokens_not_counted"].startswith(
        "the tokenizer of leap-test/tiny-cached is not in the Hugging Face cache, and plan does not download it"
    )
    assert "max_length would cut away" in plain["tokens_not_counted"]
    assert (
        (plain["rows"], plain["steps_per_epoch"]) == (counted["rows"], counted["steps_per_epoch"]) == (36, 5)
    )  # 25 + 10 rows, weighted 1:1 -> 18 + 18
    text = " ".join(invoke("plan", str(workdir / "plain.yaml"), "--gpus", "2").stdout.split())
    assert "tokens: not counted (the tokenizer of leap-test/tiny-cached is not in the Hugging Face cache" in text
    bad = write_jsonl(workdir / "bad.jsonl", [{"messages": [{"role": "usr", "content": "x"}]}])
    broken = invoke(
        "plan", str(write_config(workdir, tiny_config(model_name="leap-test/tiny-cached", data=str(bad)), "bad.yaml"))
    )
    assert broken.returncode == 2 and "'usr' is not a role" in broken.stderr  # rows are checked without a tokenizer


def test_the_planned_run_command_keeps_the_set_overrides(workdir):
    """Copying plan's driver line runs the run that was planned: the --set overrides are on it."""
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    path = str(write_config(workdir, tiny_config()))
    result = invoke("plan", path, "--json", "--set", "training_config.learning_rate=1e-4", cwd=workdir)
    assert result.returncode == 0, result.stderr
    [train] = [p for p in json.loads(result.stdout)["processes"] if p["command"][:2] == ["leap-finetune", "run"]]
    assert train["command"][2:] == [path, "--set", "training_config.learning_rate=1e-4"]


def test_ray_workers_keep_multicast_off_and_the_unused_preemption_watcher_is_not_started(monkeypatch):
    """Every process of a Ray run gets the job's env: NVLink multicast off, and Ray Train's preemption watcher (an
    extra actor process per run, observability only: our workers stop on our own request) off unless the user
    turned it on."""
    from leap_finetune.launch.distributed import PREEMPTION_WATCHER, worker_env

    monkeypatch.delenv(PREEMPTION_WATCHER, raising=False)
    env = worker_env()
    assert env["NCCL_NVLS_ENABLE"] == "0" and env[PREEMPTION_WATCHER] == "0"
    monkeypatch.setenv(PREEMPTION_WATCHER, "1")
    assert worker_env()[PREEMPTION_WATCHER] == "1"
