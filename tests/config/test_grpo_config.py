"""GRPO's config blocks at validate: rewards (built-in, custom, weights, judge), grpo_rollout with the
rollout keys, and the issue's own block (planned anywhere; vLLM required only to validate and run)."""

from __future__ import annotations

import importlib.util

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.validate.loader import load_config
from tests.conftest import write_config, write_jsonl


def _config(**overrides) -> dict:
    training = {"use_vllm": False, **overrides.pop("training_config", {})}
    config = {
        "project_name": "g",
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": ["accuracy"],
        "training_config": training,
        **overrides,
    }
    return {k: v for k, v in config.items() if v is not None}  # rewards=None: no rewards key


def _error(tmp_path, config: dict) -> str:
    with pytest.raises(LeapError) as info:
        load_config(write_config(tmp_path, config))
    return info.value.format()


def test_the_grpo_defaults(tmp_path):
    resolved = load_config(write_config(tmp_path, _config(training_config={"use_vllm": True})))
    t = resolved.training
    assert (t["use_vllm"], t["vllm_mode"], t["num_generations"], t["beta"]) == (True, "colocate", 8, 0.0)
    assert resolved.rewards.funcs == ["accuracy"] and resolved.grpo_rollout.server_gpus == 0


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (dict(rewards=None), ["training_type grpo needs rewards", "rewards: [accuracy]"]),
        (dict(rewards=["acuracy"]), ["rewards.funcs[0] is 'acuracy'", "did you mean 'accuracy'"]),
        (dict(rewards=[{"name": "format"}]), ["the 'format' reward needs pattern", "{name: format, pattern:"]),
        (dict(rewards=[{"name": "format", "pattern": "("}]), ["pattern '(' is not a regular expression"]),
        (dict(rewards=[{"name": "length", "target_tokens": -3}]), ["target_tokens is -3", "> 0"]),
        (dict(rewards=[{"name": "accuracy", "pattern": "x"}]), ["has no option pattern"]),
        (
            dict(rewards={"funcs": ["accuracy", "tool_call_valid"], "weights": [1.0]}),
            ["rewards.weights has 1 value(s), but there are 2 rewards", "give 2 weights"],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://127.0.0.1:1/v1", "prompt_template": "{answer}"}}),
            ["prompt_template names {answer}", "{completion}"],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "prompt_template": "{prompt}"}}),
            ["has no {completion}"],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "min_score": 5, "max_score": 5}}),
            ["max_score (5.0) must be above min_score (5.0)"],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "api_key_env": "LEAP_TEST_UNSET_KEY"}}),
            ["api_key_env names LEAP_TEST_UNSET_KEY, which is not set", "export LEAP_TEST_UNSET_KEY"],
        ),
        (
            dict(
                rewards={"judge": {"model": "m"}},
                grpo_rollout={"server_gpus": 1, "judge_port": 8000},
                training_config={"use_vllm": True, "vllm_mode": "server"},
            ),
            ["the local judge and the rollout server would both listen on port 8000", "judge_port"],
        ),
        (dict(rewards={"judge": {"model": "m", "temprature": 0}}), ["temprature", "temperature"]),
        (
            dict(grpo_rollout={"server_gpus": 1}),
            ["server_gpus is 1, but no rollout server is started", "vllm_mode: server"],
        ),
        (
            dict(
                grpo_rollout={"server_gpus": 1},
                training_config={"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": "http://h:8000"},
            ),
            ["points at an external rollout server", "server_gpus (1) would start a local one"],
        ),
        (
            dict(training_config={"use_vllm": True, "vllm_mode": "server"}),
            ["vllm_mode: server needs a rollout server", "server_gpus: 1"],
        ),
        (dict(grpo_rollout={"judge_gpus": 1}), ["judge_gpus is 1, but no local judge is configured"]),
        (dict(grpo_rollout={"sever_gpus": 1}), ["sever_gpus", "server_gpus"]),
        (dict(training_config={"beta": -1}), ["beta is -1", ">= 0"]),
        # rewards: what each entry and weight must be (issue 24)
        (dict(rewards=[42]), ["rewards[0] is 42: expected a reward's name", "rewards: [accuracy]"]),
        (dict(rewards={"funcs": ["accuracy", 4.5]}), ["rewards.funcs[1] is 4.5: expected a reward's name"]),
        (
            dict(rewards=["my_rewards:score"]),
            ["'my_rewards:score': a custom reward is named by its file and function", "write ./my_rewards.py::score"],
        ),
        (
            dict(rewards={"funcs": ["accuracy"], "weights": [0]}),
            [
                "every reward's weight is 0 (rewards.weights: [0])",
                "a weight of 0 for one reward is fine when another is not 0",
            ],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "weight": 0}}),
            ["every reward's weight is 0 (rewards.judge.weight: 0, the only reward)"],
        ),
        (
            dict(rewards={"funcs": ["accuracy"], "weights": [float("nan")]}),
            ["rewards.weights[0] is .nan: expected a finite number"],
        ),
        (
            dict(rewards={"funcs": ["accuracy", "tool_call_valid"], "weights": [1, float("inf")]}),
            ["rewards.weights[1] is .inf: expected a finite number"],
        ),
        (
            dict(rewards={"funcs": ["accuracy"], "weights": [True]}),
            ["rewards.weights[0] is true: expected a finite number"],
        ),
        (
            dict(
                rewards={
                    "funcs": ["accuracy"],
                    "weights": [1, 2],
                    "judge": {"model": "m", "base_url": "http://x/v1", "weight": 2},
                }
            ),
            ["the judge's weight is given twice", "keep one"],
        ),
        # the judge's numbers: key, value, expected range; booleans are not numbers
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "max_failed_steps": True}}),
            [
                "rewards.judge.max_failed_steps is true: expected a whole number >= 0",
                "give rewards.judge.max_failed_steps a whole number >= 0",
            ],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "timeout_s": -1}}),
            ["rewards.judge.timeout_s is -1: expected a number > 0"],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "retries": 1.5}}),
            ["rewards.judge.retries is 1.5: expected a whole number >= 0"],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "failure_score": 2}}),
            ["rewards.judge.failure_score is 2: expected a number from 0 to 1"],
        ),
        (
            dict(rewards={"judge": {"model": "m", "base_url": "http://x/v1", "max_score": float("inf")}}),
            ["rewards.judge.max_score is .inf: expected a finite number"],
        ),
        (
            dict(training_config={"reward_weights": [1.0]}),
            ["training_config.reward_weights is decided by leap-finetune", "set rewards.weights"],
        ),
        (
            dict(grpo_rollout={"judge_port": True}),
            ["grpo_rollout.judge_port is true: expected a whole number from 1 to 65535"],
        ),
        (dict(training_config={"cache_implementation": "statc"}), ["cache_implementation is 'statc'", "use static"]),
        (
            dict(rewards=["accuracy", "tool_call_valid", "accuracy"]),
            ["rewards.funcs[2] repeats rewards.funcs[0] (accuracy)", "set rewards.weights"],
        ),
        (
            dict(training_config={"max_completion_length": 0}),  # (was a traceback from generate after loading)
            ["training_config.max_completion_length is 0: expected a whole number of tokens >= 1"],
        ),
    ],
)
def test_grpo_mistakes_are_caught_at_validate(tmp_path, overrides, expected):
    message = _error(tmp_path, _config(**overrides))
    for text in expected:
        assert text in message, message


def test_one_reward_name_is_a_list_of_one_and_a_zero_weight_beside_another_is_kept(tmp_path):
    from leap_finetune.validate.grpo import reward_weights

    assert load_config(write_config(tmp_path, _config(rewards="accuracy"))).rewards.funcs == ["accuracy"]
    resolved = load_config(
        write_config(tmp_path, _config(rewards={"funcs": ["accuracy", "tool_call_valid"], "weights": [0, 1.5]}))
    )
    assert reward_weights(resolved.rewards) == [0.0, 1.5]


def test_grpo_blocks_belong_to_grpo(tmp_path):
    config = {"model_name": "tiny-lfm2", "dataset": {"path": "x.jsonl"}, "rewards": ["accuracy"]}
    assert "'rewards:' applies to training_type: grpo" in _error(tmp_path, config)
    config = {"model_name": "tiny-lfm2", "dataset": {"path": "x.jsonl"}, "grpo_rollout": {"server_gpus": 1}}
    assert "'grpo_rollout:' applies to training_type: grpo" in _error(tmp_path, config)


def test_custom_rewards_are_imported_and_their_signature_checked(tmp_path):
    (tmp_path / "rewards.py").write_text(
        "def good(completions, solution=None, **kwargs):\n    return [1.0 for _ in completions]\n"
        "def bad(text):\n    return 1.0\n"
    )
    resolved = load_config(write_config(tmp_path, _config(rewards=["./rewards.py::good"])))
    assert resolved.rewards.funcs == [f"{tmp_path / 'rewards.py'}::good"]
    assert "does not have the reward signature" in _error(tmp_path, _config(rewards=["./rewards.py::bad"]))
    assert "no function 'missing'" in _error(tmp_path, _config(rewards=["./rewards.py::missing"]))
    assert "does not exist" in _error(tmp_path, _config(rewards=["./nope.py::good"]))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM installed: use_vllm is valid here")
def test_the_issue_block_plans_anywhere_and_needs_vllm_to_run(tmp_path):
    """The original's block (server + judge on their own GPUs): `plan` lays out 4 GPUs; `validate`
    names the missing vLLM with the fix."""
    from tests.conftest import invoke

    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Name a color.", "solution": "teal"}] * 16)
    config = _config(
        grpo_rollout={
            "server_gpus": 1,
            "judge_gpus": 1,
            "tensor_parallel_size": 1,
            "dtype": "bfloat16",
            "gpu_memory_utilization": 0.9,
        },
        rewards={"funcs": ["accuracy"], "judge": {"model": "tiny-lfm2"}},
        training_config={
            "extends": "DEFAULT_GRPO",
            "vllm_mode": "server",
            "vllm_server_host": "auto",
            "vllm_server_port": 8000,
        },
    )
    config["training_config"].pop("use_vllm")
    path = write_config(tmp_path, config)
    plan = invoke("plan", str(path), "--gpus", "4", "--json")
    assert plan.returncode == 0, plan.stderr
    import json

    report = json.loads(plan.stdout)
    assert (report["devices"]["server"], report["devices"]["judge"], report["devices"]["training"]) == (
        [0],
        [1],
        [2, 3],
    )
    server, judge = report["processes"][:2]
    assert server["command"][1:4] == ["-m", "trl.cli.main", "vllm-serve"]
    assert server["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert "--port" in server["command"] and "8000" in server["command"]
    # vLLM is not installed here: the judge runs on transformers' own server, on its GPU
    assert judge["command"][1:5] == ["-m", "transformers.cli.transformers", "serve", "tiny-lfm2"]
    assert judge["name"] == "judge server (transformers serve, GPU)" and judge["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert judge["port"] == 8001
    assert all(p["env"]["NCCL_NVLS_ENABLE"] == "0" for p in report["processes"][:2])
    workers = [p for p in report["processes"] if p["name"].startswith("training worker")]
    assert [w["env"]["CUDA_VISIBLE_DEVICES"] for w in workers] == ["2", "3"]
    checked = invoke("validate", str(path))
    assert checked.returncode == 2
    assert "vLLM is not installed" in checked.stderr and "use_vllm: false" in checked.stderr


def test_inspect_shows_grpo_prompts_as_the_model_sees_them(tmp_path):
    from tests.conftest import invoke

    write_jsonl(
        tmp_path / "prompts.jsonl",
        [
            {"prompt": "Name a color.", "solution": "teal", "level": 2},
            {"messages": [{"role": "user", "content": "Name a fruit."}, {"role": "assistant", "content": "plum"}]},
        ],
    )
    shown = invoke("inspect", str(write_config(tmp_path, _config())), "--rows", "2")
    assert shown.returncode == 0, shown.stderr
    assert "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n" in shown.stdout
    assert "solution: teal" in shown.stdout and "level: 2" in shown.stdout
    assert "solution: plum" in shown.stdout  # the last assistant turn of a messages row is its solution
    assert "carries loss" not in shown.stdout


def test_a_column_only_later_rows_have_reaches_the_trainer(tmp_path):
    """Passed-through columns are stored for every row (None where a row lacks one), even when the first
    row does not have them (datasets' from_list would take its columns from the first row alone)."""
    from datasets import load_from_disk

    from leap_finetune.launch.checks import prepare
    from leap_finetune.launch.run_folder import stage_run_folder

    write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"prompt": "Name a color.", "solution": "teal"}, {"prompt": "Name a fruit.", "solution": "plum", "level": 2}],
    )
    resolved = load_config(write_config(tmp_path, _config()))
    _, renderer, prepared = prepare(resolved)
    stage_run_folder(resolved, prepared, renderer, True, tmp_path / "run", tmp_path / ".staging")
    stored = load_from_disk(str(tmp_path / "run" / "prepared" / "train"))
    assert stored["level"] == [None, 2] and stored["solution"] == ["teal", "plum"]


@pytest.mark.parametrize("gpus", range(1, 9))
def test_the_issue_block_plans_for_1_to_8_gpus(tmp_path, gpus):
    """Server on GPU 0, judge on GPU 1, training on the rest: one training GPU runs as a process of its own,
    several as Ray Train workers; fewer than 3 GPUs is an error with the numbers."""
    from leap_finetune.launch.devices import device_plan

    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Name a color.", "solution": "teal"}] * 16)
    config = _config(
        grpo_rollout={"server_gpus": 1, "judge_gpus": 1},
        rewards={"funcs": ["accuracy"], "judge": {"model": "tiny-lfm2"}},
        training_config={"use_vllm": True, "vllm_mode": "server", "vllm_server_host": "auto"},
    )
    resolved = load_config(write_config(tmp_path, config))
    if gpus < 3:
        with pytest.raises(LeapError) as info:
            device_plan(resolved, gpus=gpus)
        assert (
            f"the plan needs 3 GPU(s): 1 for the rollout server (grpo_rollout.server_gpus), 1 for the judge "
            f"(grpo_rollout.judge_gpus), at least 1 for training; {gpus} "
        ) in info.value.format()
        return
    plan = device_plan(resolved, gpus=gpus)
    assert (plan.server, plan.judge, plan.training) == ([0], [1], list(range(2, gpus)))
    assert plan.workers == gpus - 2 and plan.own_process == (gpus == 3) and plan.in_process == (gpus == 3)
    with pytest.raises(LeapError) as info:
        device_plan(resolved, gpus=gpus, nodes=2)
    assert "single-node only" in info.value.format()


def test_local_servers_and_a_ray_cluster_do_not_mix(tmp_path):
    from leap_finetune.launch.devices import device_plan

    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Name a color.", "solution": "teal"}] * 16)
    config = _config(rewards={"funcs": ["accuracy"], "judge": {"model": "tiny-lfm2"}}, ray={"address": "head:6379"})
    resolved = load_config(write_config(tmp_path, config))
    with pytest.raises(LeapError) as info:
        device_plan(resolved, gpus=2, nodes=1)
    assert "local servers (rollout server, judge or teacher) on the driver's machine" in info.value.format()
    assert "rewards.judge.base_url" in info.value.format()


def test_an_unknown_reward_lists_the_built_in_ones_or_the_close_name(tmp_path):
    listed = _error(tmp_path, _config(rewards=["exact_match"]))
    assert "not a built-in reward" in listed and "accuracy, format, length" in listed
    close = _error(tmp_path, _config(rewards=["acuracy"]))
    assert "did you mean 'accuracy'" in close
