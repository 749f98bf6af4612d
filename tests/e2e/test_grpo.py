"""GRPO through TRL's GRPOTrainer on CPU (transformers' generation): the bundled example raises its reward
(full and LoRA), and an LLM judge that the driver serves with a real `transformers serve` on 127.0.0.1 scores
completions; a killed judge is counted as failures (the report says how many and why) and training finishes.

For the judge test one tiny model plays both parts: asked "Name a color." it answers one of eight colors at
random, and asked "Grade: ..." it answers 7 (the judge).
"""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

import psutil
import pytest
import yaml
from transformers import TrainerCallback

from leap_finetune.api import run_config
from tests.conftest import write_config, write_jsonl

COLORS = ["red", "blue", "green", "teal", "gold", "pink", "gray", "plum"]


@pytest.fixture(scope="module")
def color_and_judge_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("color-model")
    rng = random.Random(0)
    answers = COLORS * 12  # each color equally often: the model names teal about 1 time in 8
    rng.shuffle(answers)
    rows = [
        {"messages": [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": answer}]}
        for answer in answers
    ]
    rows += [
        {
            "messages": [
                {"role": "user", "content": f"Grade: {rng.choice(COLORS)}"},
                {"role": "assistant", "content": "7"},
            ]
        }
        for _ in range(32)
    ]
    write_jsonl(folder / "sft.jsonl", rows)
    config = {
        "project_name": "colors",
        "model_name": "tiny-lfm2",
        "dataset": {"path": "sft.jsonl"},
        "training_config": {
            "max_steps": 150,
            "per_device_train_batch_size": 8,
            "learning_rate": 3e-3,
            "warmup_steps": 0,
            "logging_steps": 10,
            "save_strategy": "no",
            "max_length": 64,
        },
    }
    summary = run_config(write_config(folder, config, "sft.yaml"))
    return Path(summary["model_dir"])


def _grpo_config(folder: Path, model: Path, rewards, **training) -> Path:
    write_jsonl(folder / "prompts.jsonl", [{"prompt": "Name a color.", "solution": "teal"}] * 64)
    config = {
        "project_name": "grpo",
        "model_name": str(model),
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": rewards,
        "training_config": {
            "use_vllm": False,
            "max_steps": 24,
            "per_device_train_batch_size": 16,
            "num_generations": 8,
            "max_completion_length": 6,
            "learning_rate": 5e-4,
            "logging_steps": 1,
            "save_strategy": "no",
            **training,
        },
    }
    return write_config(folder, config, "grpo.yaml")


def _metrics(summary: dict) -> list[dict]:
    return [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def examples_copy(tmp_path_factory) -> Path:
    """The bundled CPU example, warm-up run: examples/grpo_tiny_warmup.yaml (then grpo_tiny.yaml starts from it)."""
    import shutil

    folder = tmp_path_factory.mktemp("examples") / "examples"
    shutil.copytree(
        Path(__file__).resolve().parents[2] / "examples", folder, ignore=shutil.ignore_patterns("outputs", "images")
    )
    run_config(folder / "grpo_tiny_warmup.yaml")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_grpo_example_raises_the_accuracy_reward(examples_copy, lora):
    """examples/grpo_tiny.yaml as bundled (and with LoRA): the model named teal about 1 time in 8."""
    import yaml

    config = yaml.safe_load((examples_copy / "grpo_tiny.yaml").read_text())
    if lora:
        config["project_name"] = "grpo-tiny-lora"
        config["peft_config"] = {"extends": "DEFAULT_LORA", "r": 16, "lora_alpha": 32, "lora_dropout": 0.0}
        config["training_config"]["learning_rate"] = 1e-3  # 2e-3 let the tiny policy collapse (seed 1: 0.5 -> 0.0)
    path = examples_copy / ("grpo_tiny_lora.yaml" if lora else "grpo_tiny.yaml")
    path.write_text(yaml.safe_dump(config))
    summary = run_config(path)
    rewards = [m["rewards/accuracy/mean"] for m in _metrics(summary) if "rewards/accuracy/mean" in m]
    print("accuracy reward per step:", rewards)
    assert len(rewards) == 32
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert first < 0.45, rewards
    # measured over seeds 1-3 and 42 (rollouts through rl/sampler.py): full +0.55..+0.69, LoRA +0.35..+0.41
    assert last > first + (0.2 if lora else 0.35), rewards
    assert summary["initial_reward"] == pytest.approx(first) and summary["final_reward"] == pytest.approx(last)
    samples = [json.loads(line) for line in (Path(summary["run_dir"]) / "completions.jsonl").read_text().splitlines()]
    assert samples and {"step", "prompt", "completion", "rewards", "advantage"} <= set(samples[0])
    assert (Path(summary["run_dir"]) / "model" / "config.json").exists()
    # the rollouts came from leap-finetune's decoding loop (rl/sampler.py), with LoRA too
    assert summary["rollouts"] == {"engine": "leap-finetune sampler", "why_not_sampler": None}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KillServerAt(TrainerCallback):
    """Kills the server listening on `port` after a given step (the judge must count failures and training
    go on)."""

    def __init__(self, port: int, step: int):
        self.port, self.step, self.killed = port, step, []

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.step:
            return
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info["cmdline"] or []
            if "serve" in cmdline and str(self.port) in cmdline:
                process.kill()
                process.wait(timeout=30)
                self.killed.append(cmdline)


@pytest.mark.slow
def test_the_driver_runs_a_cpu_judge_whose_death_is_counted(workdir, color_and_judge_model):
    """rewards.judge without base_url and judge_gpus 0: the driver starts `transformers serve` on CPU before
    training, training's requests reach it, and a judge killed mid-run is counted, never fatal."""
    color_model = color_and_judge_model
    port = _free_port()
    judge = {
        "model": str(color_model),
        "prompt_template": "Grade: {completion}",
        "min_score": 0,
        "max_score": 10,
        "timeout_s": 20,
        "retries": 0,
        "max_tokens": 4,
    }
    path = _grpo_config(workdir, color_model, {"funcs": ["accuracy"], "judge": judge}, max_steps=5)
    config = yaml.safe_load(path.read_text())
    config["grpo_rollout"] = {"judge_port": port}
    path.write_text(yaml.safe_dump(config))
    kill = KillServerAt(port, 2)
    summary = run_config(path, callbacks=[kill])
    assert len(kill.killed) == 1 and "transformers.cli.transformers" in kill.killed[0], kill.killed
    metrics = [m for m in _metrics(summary) if "rewards/judge/mean" in m]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    before, after = metrics[:2], metrics[2:]
    # the judge model answers 7 of 10: normalised 0.7, and no failures while its server runs
    assert all(m["rewards/judge/mean"] == pytest.approx(0.7) and m["judge/failures"] == 0 for m in before), before
    # then every request fails (16 completions per step), scored with failure_score 0, and training goes on
    assert all(m["judge/failures"] == 16 and m["rewards/judge/mean"] == 0 for m in after), after
    assert json.loads((Path(summary["run_dir"]) / "summary.json").read_text())["global_step"] == 5
    # (3 failed steps reach the default max_failed_steps at the last step: the run is finished, not stopped)
    assert summary["judge"]["failures"] == 48 and summary["judge"]["requests"] == 80
    assert summary["judge"]["last_failure"].startswith("APIConnectionError"), summary["judge"]
    log = (Path(summary["run_dir"]) / "servers" / "judge_server.log").read_text()
    assert log.count("POST /v1/chat/completions") == 32  # 2 steps x 16 completions reached the server


FLAKY_REWARD = """import json, os

def flaky(completions, trainer_state, **kwargs):
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as log:
        log.write(json.dumps([sorted([*kwargs, "trainer_state"]), kwargs["tools"]]) + "\\n")
    if trainer_state.global_step >= 1:
        raise KeyError("level")
    return [0.0] * len(completions)
"""


def test_a_custom_reward_that_raises_while_training_stops_the_run_at_that_step(workdir):
    """tiny-lfm2, 2 completions per step: the reward passes `run`'s call before the model loads and step 1, then
    raises at step 2. Exit 2 naming the function, its line, the step and the prompt; checkpoint-1 intact and named,
    nothing of step 2 saved; the call before training got the same keyword arguments as TRL's."""
    from tests.conftest import invoke

    (workdir / "flaky_rewards.py").write_text(FLAKY_REWARD)
    tools = [{"type": "function", "function": {"name": "get_color", "parameters": {"type": "object"}}}]
    write_jsonl(workdir / "prompts.jsonl", [{"prompt": "Name a color.", "solution": "teal", "tools": tools}] * 4)
    config = {
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": ["./flaky_rewards.py::flaky", "tool_call_valid"],
        "output_dir": "run",
        "training_config": {
            "use_vllm": False,
            "max_steps": 3,
            "per_device_train_batch_size": 2,
            "num_generations": 2,
            "max_completion_length": 4,
            "logging_steps": 1,
            "save_steps": 1,
        },
    }
    ran = invoke("run", str(write_config(workdir, config)), cwd=workdir)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    error = " ".join(ran.stderr[ran.stderr.index("error: ") :].split())
    assert (
        "rewards.funcs[0]: the custom reward flaky_rewards.py::flaky raised KeyError: 'level' (flaky_rewards.py, "
        "line 7) at training step 2, on 2 completions of the prompt 'Name a color.'"
    ) in error, error
    assert (
        "resume with training_config.resume_from_checkpoint: latest (the last complete checkpoint, checkpoint-1, "
        "is intact" in error
    )
    assert sorted(p.name for p in (workdir / "run").glob("checkpoint-*")) == ["checkpoint-1"]
    calls = [json.loads(line) for line in (workdir / "calls.jsonl").read_text().splitlines()]
    names = [names for names, _ in calls]
    assert len(calls) == 3 and names[0] == names[1] == names[2], calls  # before training, step 1, step 2
    # the row's tools reach the rewards (tool_call_valid checks the called names against them) as JSON text
    assert [json.loads(t) for t in calls[1][1]] == [tools, tools]
