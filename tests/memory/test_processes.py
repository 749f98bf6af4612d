"""Every GPU process `plan` lists has its predicted memory (memory/servers.py): the rollout server, the judge, the
evaluation server, and what GRPO's rollouts hold inside a training process (the sampler's copy and caches, colocated
vLLM's share); a CPU process has none."""

from __future__ import annotations

import json

import pytest

from leap_finetune.memory.estimate import GIB
from leap_finetune.memory.plan import shape_of, training_process_memory
from leap_finetune.validate.loader import load_config
from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl


def _grpo(workdir, **training) -> dict:
    write_jsonl(workdir / "prompts.jsonl", [{"prompt": f"Name color {i}.", "solution": "teal"} for i in range(16)])
    return {
        "project_name": "g",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": ["accuracy"],
        "training_config": {"use_vllm": False, **training},
    }


def _plan(workdir, config: dict, *args: str) -> dict:
    result = invoke("plan", str(write_config(workdir, config)), "--json", *args, cwd=workdir)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_rollout_server_and_judge_have_their_memory_and_vllm_s_share_needs_the_card(workdir):
    config = _grpo(workdir, use_vllm=True, vllm_mode="server", vllm_server_host="auto")
    config["grpo_rollout"] = {"server_gpus": 1, "judge_gpus": 1, "gpu_memory_utilization": 0.5}
    config["rewards"] = {"funcs": ["accuracy"], "judge": {"model": "tiny-lfm2"}}
    plan = _plan(workdir, config, "--gpus", "3", "--gpu-memory", "40GiB")
    server, judge, *rest = plan["processes"]
    weights = 2 * shape_of(load_config(write_config(workdir, config))).parameters / GIB
    # vLLM reserves its share of the whole card: the bf16 weights inside it, the rest its KV cache
    assert server["memory"]["peak_gib"] == pytest.approx(0.5 * 40, abs=0.01)
    assert server["memory"]["weights_gib"] == pytest.approx(weights, abs=0.01)
    assert server["memory"]["cache_gib"] == pytest.approx(20 - weights, abs=0.01)
    # (no vLLM here: the judge is transformers serve on its GPU - its bf16 weights and one request's cache)
    assert judge["name"] == "judge server (transformers serve, GPU)"
    assert judge["memory"]["weights_gib"] == pytest.approx(weights, abs=0.01) and judge["memory"]["peak_gib"] < 1
    [train] = [p for p in rest if p["name"].startswith("train")]
    assert train["memory"]["cache_gib"] == 0  # (rollouts come from the server)
    assert [p["memory"] for p in rest if p["name"].startswith("driver")] == [None]
    # without the card's size vLLM's share is named, not guessed
    plan = _plan(workdir, config, "--gpus", "3")
    assert plan["processes"][0]["memory"] is None
    assert "gpu_memory_utilization 0.5" in plan["processes"][0]["memory_note"]
    text = invoke("plan", str(write_config(workdir, config)), "--gpus", "3", "--gpu-memory", "40GiB", cwd=workdir)
    lines = [line for line in text.stdout.splitlines() if "GPU memory:" in line]
    assert len(lines) == 3 and "~20.0 GiB peak" in lines[0] and "cache" in lines[0], text.stdout


def test_colocated_vllm_s_share_is_in_the_training_process(workdir):
    config = _grpo(workdir, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.25)
    plan = _plan(workdir, config, "--gpus", "1", "--gpu-memory", "80GiB")
    [train] = [p for p in plan["processes"] if p["name"].startswith("train")]
    assert train["memory"]["cache_gib"] == pytest.approx(0.25 * 80, abs=0.01)
    assert train["memory"]["peak_gib"] > 20
    unknown = _plan(workdir, config, "--gpus", "1")
    [train] = [p for p in unknown["processes"] if p["name"].startswith("train")]
    assert "colocated vLLM's 0.25 of the GPU's memory" in train["memory_note"]


def test_the_sampler_holds_a_bf16_copy_and_two_caches_that_grow_with_the_batch(workdir):
    from dataclasses import replace

    from leap_finetune.memory.servers import kv_bytes

    resolved = load_config(write_config(workdir, _grpo(workdir, cache_implementation="static")))
    shape = shape_of(resolved)
    cache = training_process_memory(resolved).cache
    t = resolved.training
    rows = t["per_device_train_batch_size"] * (t.get("gradient_accumulation_steps") or 1)
    kv = kv_bytes(shape, rows, 64 * -(-(512 + t["max_completion_length"]) // 64))
    assert cache == pytest.approx(2 * shape.parameters + 2 * kv)  # (the copy, and CACHES_KEPT caches)
    doubled = resolved.model_copy(update={"training": {**t, "per_device_train_batch_size": 2 * rows}})
    assert training_process_memory(doubled).cache == pytest.approx(2 * shape.parameters + 4 * kv)
    # transformers' generate (no static cache): no copy, one cache per rollout
    generate = resolved.model_copy(update={"training": {**t, "cache_implementation": None}})
    assert training_process_memory(generate).cache == pytest.approx(kv)
    assert replace(training_process_memory(resolved), cache=0).peak < training_process_memory(resolved).peak


def test_a_small_card_lowers_colocated_vllm_s_share_to_what_the_rollouts_need(workdir):
    """LFM2-1.2B's shape (built from its published architecture, nothing downloaded): at 80 GiB TRL's 0.3 is
    24 GiB where ~3.6 GiB holds the weights, the cache and the headroom."""
    from leap_finetune.memory.budget import _rollout_levers
    from leap_finetune.memory.shapes import model_shape

    resolved = load_config(write_config(workdir, _grpo(workdir, use_vllm=True, vllm_mode="colocate")))
    shape = model_shape("LiquidAI/LFM2-1.2B")
    [(key, share, reason)] = list(_rollout_levers(resolved, set(), shape, None, 80 * GIB))
    assert key == "vllm_gpu_memory_utilization" and share == 0.05 and "8 x 768 tokens" in reason
    [(_, share16, _)] = list(_rollout_levers(resolved, set(), shape, None, 16 * GIB))
    assert 0.05 < share16 < 0.3
    assert list(_rollout_levers(resolved, {"vllm_gpu_memory_utilization"}, shape, None, 80 * GIB)) == []


def test_a_reserved_evaluation_server_has_vllm_s_share_and_a_cpu_one_none(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(40))
    (workdir / "bench.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}\n'
    )
    evals = {"eval_steps": 3, "benchmarks": [{"name": "hi", "path": "bench.jsonl", "metric": "exact_match"}]}
    gpu = tiny_config(evals=evals, async_eval={"mode": "reserved", "vllm_gpus": 1, "gpu_memory_utilization": 0.6})
    plan = _plan(workdir, gpu, "--gpus", "2", "--gpu-memory", "24GiB")
    [server] = [p for p in plan["processes"] if p["name"].startswith("evaluation server")]
    assert server["memory"]["peak_gib"] == pytest.approx(0.6 * 24, abs=0.01)
    cpu = tiny_config(evals=evals, async_eval={"mode": "reserved", "vllm_gpus": 0})
    plan = _plan(workdir, cpu, "--gpus", "1", "--gpu-memory", "24GiB")
    [server] = [p for p in plan["processes"] if p["name"].startswith("evaluation server")]
    assert server["memory"] is None
