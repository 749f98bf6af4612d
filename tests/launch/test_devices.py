"""The device plan: counts in, device indices out, every impossible plan an error with the numbers;
and `leap-finetune plan` (text and --json) for machines and clusters the test is not on."""

from __future__ import annotations

import json
import time

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.launch.devices import plan_devices
from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl


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


@pytest.mark.parametrize(("counts", "message"), [
    (dict(gpus=8, server=1, judge=1, training=7), "requests 1 server + 1 judge + 0 eval + 7 training GPU(s), but 8 are visible"),
    (dict(gpus=2, server=1, judge=1), "reserves 2 of the 2 visible GPU(s) for servers (server 1, judge 1, eval 0): "
                                      "none is left for training"),
    (dict(gpus=4, nodes=2, server=1), "single-node only"),
    (dict(gpus=0, server=1), "no GPU is visible"),
    (dict(gpus=2, num_workers=3), "ray.num_workers is 3, but the plan has 2 training GPU(s)"),
    (dict(gpus=2, nodes=2, num_workers=5), "(2 on each of 2 nodes)"),
    (dict(gpus=1, fsdp=True), "fsdp shards the model over several workers, but the plan has 1"),
    (dict(gpus=0, fsdp=True), "fsdp shards the model over several workers"),
    (dict(gpus=0, num_workers=2, fsdp=True), "fsdp shards the model over GPU workers, but no GPU is visible"),
])
def test_impossible_plans_say_the_numbers(counts, message):
    with pytest.raises(LeapError) as info:
        plan_devices(**counts)
    assert message in info.value.format()


@pytest.fixture
def config(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(40))
    return write_config(workdir, tiny_config(training_config={"per_device_train_batch_size": 4,
                                                              "gradient_accumulation_steps": 2}))


def test_plan_json_for_a_machine_we_are_not_on(config, workdir):
    result = invoke("plan", str(config), "--gpus", "4", "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["nodes"] == 1 and plan["workers"] == 4
    assert plan["devices"] == {"server": [], "judge": [], "eval": [], "training": [0, 1, 2, 3]}
    assert plan["batch"] == {"per_device": 4, "gradient_accumulation_steps": 2, "workers": 4, "global": 32}
    assert plan["steps_per_epoch"] == 2 and plan["rows"] == 40
    workers = [p for p in plan["processes"] if p["name"].startswith("training worker")]
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in workers] == ["0", "1", "2", "3"]
    assert all(p["env"]["NCCL_NVLS_ENABLE"] == "0" for p in plan["processes"][1:])

    two_nodes = json.loads(invoke("plan", str(config), "--gpus", "2", "--nodes", "2", "--json", cwd=workdir).stdout)
    assert two_nodes["workers"] == 4 and [p["node"] for p in two_nodes["processes"] if "rank" in p["name"]] == [0, 0, 1, 1]
    one = json.loads(invoke("plan", str(config), "--gpus", "1", "--json", cwd=workdir).stdout)
    assert one["in_process"] and one["processes"] == [
        {"name": "train", "node": 0, "command": ["leap-finetune", "run", str(config)], "env": {"CUDA_VISIBLE_DEVICES": "0"}}]
    text = invoke("plan", str(config), "--gpus", "2", cwd=workdir).stdout
    assert "workers: 2 on 1 node(s) - Ray Train, nccl" in text and "16 rows per step" in text


def test_a_reserved_evaluation_gpu_is_taken_out_of_training_before_anything_starts(workdir, config):
    (workdir / "bench.jsonl").write_text('{"messages": [{"role": "user", "content": "Hi"}, '
                                         '{"role": "assistant", "content": "Hello"}]}\n')
    data = tiny_config(evals={"benchmarks": [{"name": "hi", "path": "bench.jsonl", "metric": "exact_match"}]},
                       async_eval={"mode": "reserved", "vllm_gpus": 1, "reserved": {"server_port": 8123}})
    result = invoke("plan", str(write_config(workdir, data, "reserved.yaml")), "--gpus", "4", "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["devices"]["eval"] == [0] and plan["devices"]["training"] == [1, 2, 3] and plan["workers"] == 3
    [server] = [p for p in plan["processes"] if p["name"].startswith("evaluation server")]
    assert server["env"]["CUDA_VISIBLE_DEVICES"] == "0" and "8123" in server["command"]
    workers = [p for p in plan["processes"] if p["name"].startswith("training worker")]
    assert [p["env"]["CUDA_VISIBLE_DEVICES"] for p in workers] == ["1", "2", "3"]
    two_nodes = invoke("plan", str(write_config(workdir, data, "reserved.yaml")), "--gpus", "4", "--nodes", "2",
                       cwd=workdir)
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
