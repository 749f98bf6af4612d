"""Multi-turn GRPO with an environment, end to end on CPU (docs/agents.md): a tiny LFM2 warmed up to call a lookup
tool half the time learns, from a custom reward that reads the whole episode, to call it; the episodes' metrics,
completions.jsonl and the run report show the turns, calls and tool results. The example itself
(examples/agents_*.yaml, several minutes) is measured in docs/agents.md; this is its cheap twin."""

from __future__ import annotations

import json
import random
import textwrap
from pathlib import Path

import pytest

from leap_finetune.api import run_config
from tests.conftest import invoke, write_config, write_jsonl

TOOLS = '''
def lookup(key: str) -> str:
    """Read a stored value.

    Args:
        key: e.g. "door"
    """
    return {"door": "red", "car": "blue"}[key]
'''
REWARD = '''
def looked_up(completions, episode, **kwargs):
    """1 when the episode called lookup and it answered (the reward reads the turns, not the final text)."""
    return [1.0 if any(m["role"] == "tool" and m["ok"] for m in turns) else 0.0 for turns in episode]
'''
SCHEMA = {
    "name": "lookup",
    "description": "Read a stored value.",
    "parameters": {
        "type": "object",
        "properties": {"key": {"type": "string", "description": 'e.g. "door"'}},
        "required": ["key"],
    },
}


@pytest.fixture(scope="module")
def half_caller(tmp_path_factory) -> Path:
    """tiny-lfm2 after SFT on traces where half the answers call lookup first and half answer at once."""
    folder = tmp_path_factory.mktemp("half-caller")
    rng = random.Random(0)
    rows = []
    for _ in range(96):
        key = rng.choice(["door", "car"])
        user = {"role": "user", "content": f"What color is the {key}?"}
        value = {"door": "red", "car": "blue"}[key]
        if rng.random() < 0.5:
            call = f'<|tool_call_start|>[lookup(key="{key}")]<|tool_call_end|>'
            turns = [user, {"role": "assistant", "content": call}, {"role": "tool", "content": value}]
            turns.append({"role": "assistant", "content": value})
        else:
            turns = [user, {"role": "assistant", "content": rng.choice(["red", "blue"])}]
        rows.append({"messages": turns, "tools": [SCHEMA]})
    write_jsonl(folder / "sft.jsonl", rows)
    config = {
        "project_name": "half-caller",
        "model_name": "tiny-lfm2",
        "dataset": {"path": "sft.jsonl"},
        "training_config": {
            "max_steps": 120,
            "per_device_train_batch_size": 8,
            "learning_rate": 3e-3,
            "warmup_steps": 0,
            "logging_steps": 20,
            "save_strategy": "no",
            "max_length": 256,
        },
    }
    return Path(run_config(write_config(folder, config, "sft.yaml"))["model_dir"])


def test_a_reward_on_the_episode_teaches_the_model_to_call_the_tool(tmp_path, half_caller):
    (tmp_path / "tools.py").write_text(textwrap.dedent(TOOLS))
    (tmp_path / "rewards.py").write_text(textwrap.dedent(REWARD))
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"What color is the {k}?"} for k in ("door", "car")] * 32)
    config = {
        "project_name": "agents",
        "model_name": str(half_caller),
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "environment": {"tools": "./tools.py", "max_turns": 2, "workers": 2},
        "rewards": ["./rewards.py::looked_up"],
        "training_config": {
            "use_vllm": False,
            "max_steps": 24,
            "per_device_train_batch_size": 16,
            "num_generations": 8,
            "max_completion_length": 48,
            "learning_rate": 2e-4,  # (5e-4 breaks this 120-step warm-up's calls within a step)
            "logging_steps": 4,
            "save_strategy": "no",
        },
    }
    summary = run_config(write_config(tmp_path, config))
    run_dir = Path(summary["run_dir"])
    logs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    calls = [r["episodes/calls"] for r in logs if "episodes/calls" in r]
    assert len(calls) == 6
    first, last = calls[0], sum(calls[-2:]) / 2
    assert 0.2 < first < 0.7 and last > first + 0.15, calls  # (the warm-up calls about 40% of the time)
    assert all(r["episodes/tool_error_rate"] < 0.2 for r in logs if "episodes/tool_error_rate" in r)
    episodes = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    called = [e for e in episodes if any(m["role"] == "tool" for m in e["episode"])]
    assert called, "no episode with a tool call in completions.jsonl"
    turn = called[0]["episode"]
    assert turn[0]["tool_calls"][0]["name"] == "lookup" and turn[1]["ok"] and turn[1]["content"] in ("red", "blue")
    assert called[0]["rewards"]["looked_up"] == 1.0 and called[0]["completion"] == turn[-1]["content"]
    assert (run_dir / "plots" / "episodes.png").is_file()
    report = (run_dir / "train.log").read_text()
    assert "calls and" in report and "turns per episode" in report  # (the run report's episodes row)
    assert "1 tool(s) (lookup) from tools.py; up to 2 turns" in report  # (the config table's environment row)


def test_a_benchmark_of_episodes_is_scored_during_training_and_by_eval(tmp_path, half_caller):
    """metric: episodes plays GRPO rows in the config's environment (here an sft run's: the block serves the
    benchmark only), before and after training and in `leap-finetune eval`; the score is the share answered right."""
    (tmp_path / "tools.py").write_text(textwrap.dedent(TOOLS))
    rows = [{"prompt": f"What color is the {k}?", "solution": v} for k, v in (("door", "red"), ("car", "blue"))] * 6
    write_jsonl(tmp_path / "episodes.jsonl", rows)
    write_jsonl(tmp_path / "sft.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                      {"role": "assistant", "content": "hello"}]}] * 8)  # fmt: skip
    config = {
        "project_name": "episodes-bench",
        "model_name": str(half_caller),
        "dataset": {"path": "sft.jsonl"},
        "environment": {"tools": "./tools.py", "max_turns": 2, "workers": 2},
        "evals": {"max_new_tokens": 48, "benchmarks": [{"name": "lookups", "path": "episodes.jsonl",
                                                        "metric": "episodes"}]},
        "training_config": {"max_steps": 2, "per_device_train_batch_size": 4, "save_strategy": "no",
                            "logging_steps": 1, "learning_rate": 1e-6},
    }  # fmt: skip
    path = write_config(tmp_path, config)
    summary = run_config(path)
    logs = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    scored = [r for r in logs if "benchmark/lookups/score" in r]
    assert len(scored) == 2 and all(r["benchmark/lookups/rows"] == 12 for r in scored)  # before and after
    assert scored[0]["benchmark/lookups/calls"] > 0 and scored[0]["benchmark/lookups/turns"] >= 1

    result = invoke(
        "eval", str(path), "--set", f"checkpoint={summary['run_dir']}", "--output", str(tmp_path / "e.json")
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "e.json").read_text())["results"]
    predictions = [json.loads(x) for x in (tmp_path / "e.predictions" / "lookups.jsonl").read_text().splitlines()]
    right = [p for p in predictions if p["score"] == 1.0]
    assert report["benchmark/lookups/score"] == len(right) / 12
    assert all(p["prediction"] == p["reference"] for p in right) and len(predictions) == 12
    called = [p for p in predictions if any(m["role"] == "tool" for m in p["episode"])]
    assert called and all(p["episode"][1]["content"] in ("red", "blue") for p in called)  # (the tool really ran)


def test_episode_benchmarks_are_refused_where_they_cannot_run(tmp_path):
    (tmp_path / "tools.py").write_text(textwrap.dedent(TOOLS))
    write_jsonl(tmp_path / "episodes.jsonl", [{"prompt": "What color is the door?", "solution": "red"}])
    write_jsonl(tmp_path / "sft.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                      {"role": "assistant", "content": "hello"}]}] * 8)  # fmt: skip
    bench = {"benchmarks": [{"name": "lookups", "path": "episodes.jsonl", "metric": "episodes"}]}
    base = {"project_name": "x", "model_name": "tiny-lfm2", "dataset": {"path": "sft.jsonl"}}
    cases = [
        ({**base, "evals": bench}, "has no `environment:`"),
        ({**base, "environment": {"tools": "./tools.py"}}, "no benchmark has metric episodes"),
        ({**base, "evals": bench, "environment": {"tools": "./tools.py", "augment_tools": True}}, "always see the real"),
        ({**base, "evals": bench, "environment": {"tools": "./tools.py"}, "async_eval": {"mode": "sidecar"}},
         "answers one turn at a time"),
    ]  # fmt: skip
    for config, said in cases:
        result = invoke("validate", str(write_config(tmp_path, config)))
        assert result.returncode == 2 and said in result.stderr, (said, result.stderr)
    write_jsonl(tmp_path / "episodes.jsonl", [{"prompt": "What color is the door?"}])
    result = invoke(
        "validate", str(write_config(tmp_path, {**base, "evals": bench, "environment": {"tools": "./tools.py"}}))
    )
    assert result.returncode == 2 and "episodes.jsonl" in result.stderr and "solution" in result.stderr
