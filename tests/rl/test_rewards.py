"""The built-in rewards, custom ones, and the judge's score parsing."""

from __future__ import annotations

import json

import pytest

from leap_finetune.rl.judge import parse_score
from leap_finetune.rl.rewards import build_reward


def test_accuracy_is_math_aware_and_falls_back_to_the_text():
    accuracy = build_reward("accuracy")
    completions = [r"So the answer is \boxed{0.5}", r"\boxed{\frac{1}{3}}", "Teal.", "teal green", "tealgreen", "x"]
    solutions = [r"\frac{1}{2}", r"\frac{1}{2}", "teal", "teal", "teal", ""]
    assert accuracy(completions, solution=solutions) == [1.0, 0.0, 1.0, 1.0, 0.0, None]
    # chat-shaped completions (one assistant message) too
    assert accuracy([[{"role": "assistant", "content": "teal"}]], solution=["teal"]) == [1.0]


def test_format_length_and_tool_call_rewards():
    fmt = build_reward({"name": "format", "pattern": r"^Answer: \w+$"})
    assert fmt(["Answer: teal", "teal"]) == [1.0, 0.0] and fmt.__name__ == "format"
    length = build_reward({"name": "length", "target_tokens": 4})
    assert length(["a", "b", "c"], completion_ids=[[1, 2, 3, 4], [1, 2], [1] * 12]) == [1.0, 0.5, 0.0]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    valid = build_reward("tool_call_valid")
    call = '<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>'
    other = "<|tool_call_start|>[get_time()]<|tool_call_end|>"
    assert valid([call, other, "no call"], tools=[tools, tools, tools]) == [1.0, 0.0, 0.0]
    # as the prepared data holds them (JSON text, "" for a row without tools: any parsed call counts)
    assert valid([call, other, other], tools=[json.dumps(tools), json.dumps(tools), ""]) == [1.0, 0.0, 1.0]


def test_a_custom_reward_gets_the_rows_columns(tmp_path):
    (tmp_path / "r.py").write_text(
        "def shout(completions, level=None, **kwargs):\n"
        "    return [float(c.isupper()) * l for c, l in zip(completions, level)]\n"
    )
    shout = build_reward(f"{tmp_path / 'r.py'}::shout")
    assert shout(["HI", "hi"], level=[2.0, 3.0]) == [2.0, 0.0] and shout.__name__ == "shout"


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ('{"score": 8}', 8.0),
        ('Score: {"score": 6.5} ok', 6.5),
        ("I give it 7/10", 7.0),
        ("{'score': 3}", 3.0),
        ("great!", None),
        ('{"score": true} 4', 4.0),
    ],
)
def test_judge_scores_are_read_from_json_or_the_first_number(answer, score):
    assert parse_score(answer) == score


CUSTOM = """
import json, math, os

def records(completions, **kwargs):
    with open(os.path.join(os.path.dirname(__file__), "calls.jsonl"), "a") as log:
        log.write(json.dumps({"completions": completions, "columns": sorted(kwargs),
                              "values": {k: v for k, v in kwargs.items() if k in ("solution", "prompt_text", "level")},
                              "step": kwargs["trainer_state"].global_step}) + "\\n")
    return [float(c == s) if s else None for c, s in zip(completions, kwargs["solution"])]

def raises(completions, **kwargs):
    return [1 / len(c) for c in completions]

def one_value(completions, **kwargs):
    return [1.0]

def words(completions, **kwargs):
    return [1.0 if c else "low" for c in completions]

def nan_when_empty(completions, **kwargs):
    return [math.nan if not c else 1.0 for c in completions]

def a_number(completions, **kwargs):
    return 0.5

async def awaited(completions, **kwargs):
    return [True for c in completions]
"""


def _custom_config(folder, name: str, **rewards) -> str:
    from tests.conftest import write_config, write_jsonl

    (folder / "my_rewards.py").write_text(CUSTOM)
    write_jsonl(
        folder / "prompts.jsonl",
        [
            {"prompt": "Name a color.", "solution": "teal"},
            {"prompt": "Name a fruit.", "level": 2},
            {"prompt": "Name a tree.", "solution": "oak"},
        ],
    )
    config = {
        "model_name": "tiny-lfm2",
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": {"funcs": [f"./my_rewards.py::{name}"], **rewards},
        "training_config": {"use_vllm": False},
    }
    return str(write_config(folder, config))


def test_validate_calls_a_custom_reward_once_on_the_first_rows_as_trl_does(tmp_path):
    """The first 2 training rows, each with its solution and an empty text as completions, and the columns TRL
    passes (None where a row lacks one); the note says that validate ran the user's code."""
    from tests.conftest import invoke

    checked = invoke("validate", _custom_config(tmp_path, "records"))
    assert checked.returncode == 0, checked.stderr
    (call,) = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert call["completions"] == ["teal", "", ""] and call["step"] == 0
    assert call["columns"] == [
        "completion_ids",
        "level",
        "log_extra",
        "log_metric",
        "prompt_text",
        "prompts",
        "solution",
        "tools",
        "trainer_state",
    ]
    assert call["values"] == {
        "solution": ["teal", "teal", ""],
        "prompt_text": ["Name a color.", "Name a color.", "Name a fruit."],
        "level": [None, None, 2],
    }
    assert (
        "custom reward(s) my_rewards.py::records: called once on 3 placeholder completion(s) of 2 training row(s) "
        "(prompts.jsonl, line 1; prompts.jsonl, line 2)"
    ) in checked.stderr
    assert "rewards.check_at_validate: false skips this call" in checked.stderr
    assert invoke("validate", _custom_config(tmp_path, "awaited")).returncode == 0  # async def, booleans as 1/0


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "raises",
            [
                "my_rewards.py::raises raised ZeroDivisionError: division by zero (my_rewards.py, line 12) when "
                "called on 3 placeholder completion(s) of 2 training row(s) (prompts.jsonl, line 1; prompts.jsonl, "
                "line 2)",
                "a completion can be empty",
            ],
        ),
        (
            "one_value",
            [
                "my_rewards.py::one_value returned [1.0] when called on",
                ": 1 value(s) for 3 completion(s)",
                "one number per completion",
            ],
        ),
        (
            "words",
            [
                "my_rewards.py::words returned [1.0, 'low', 'low']",
                "its value for the completion '' of prompts.jsonl, line 1 is 'low' (a string)",
            ],
        ),
        (
            "nan_when_empty",
            [
                "its value for the completion '' of prompts.jsonl, line 1 is NaN",
                "return None for a completion the reward should leave out",
            ],
        ),
        ("a_number", ["returned 0.5 when called on", "a number, not a list"]),
    ],
)
def test_a_custom_reward_that_answers_wrong_fails_validate(tmp_path, name, expected):
    from tests.conftest import invoke

    checked = invoke("validate", _custom_config(tmp_path, name))
    assert checked.returncode == 2 and "Traceback" not in checked.stderr, checked.stderr
    assert f"rewards.funcs[0]: the custom reward my_rewards.py::{name}" in checked.stderr
    for text in expected + ["rewards.check_at_validate: false skips this call"]:
        assert text in " ".join(checked.stderr.split()), checked.stderr


def test_check_at_validate_false_does_not_call_the_reward(tmp_path):
    from tests.conftest import invoke

    checked = invoke("validate", _custom_config(tmp_path, "raises", check_at_validate=False))
    assert checked.returncode == 0, checked.stderr
    assert "called once" not in checked.stderr


def test_while_training_a_custom_reward_is_checked_at_every_call(tmp_path):
    """What TRL's call gets back: plain numbers; an exception, a wrong length, text or NaN: a LeapError naming the
    function, the training step and the prompt."""
    from transformers import TrainerState

    from leap_finetune.errors import LeapError

    (tmp_path / "my_rewards.py").write_text(CUSTOM)
    columns = {
        "prompts": ["<p>Name a color.", "<p>Name a color."],
        "prompt_text": ["Name a color."] * 2,
        "solution": ["teal", "teal"],
        "trainer_state": TrainerState(global_step=4),
    }

    def run(name: str, completions=("teal", "")):
        reward = build_reward(
            f"{tmp_path / 'my_rewards.py'}::{name}", where="grpo.yaml: rewards.funcs[0]", then=lambda: "run again"
        )
        with pytest.raises(LeapError) as info:
            reward(list(completions), **columns)
        return info.value

    assert build_reward(f"{tmp_path / 'my_rewards.py'}::records")(["teal", "red"], **columns) == [1.0, 0.0]
    raised = run("raises")
    assert raised.where == "grpo.yaml: rewards.funcs[0]" and isinstance(raised.__cause__, ZeroDivisionError)
    assert raised.message == (
        "the custom reward my_rewards.py::raises raised ZeroDivisionError: division by zero "
        "(my_rewards.py, line 12) at training step 5, on 2 completions of the prompt "
        "'Name a color.'"
    )
    assert raised.fix.endswith("then run again")
    assert "returned [1.0] at training step 5" in run("one_value").message
    assert run("words").message.endswith(
        "value 2, for the completion '' of the prompt 'Name a color.', is 'low' (a string)"
    )
    assert run("nan_when_empty").message.endswith("is NaN")


def test_accuracy_never_rewards_an_answer_against_a_solution_with_nothing_left(tmp_path):
    """A solution of "..." or "?!" normalises to nothing: an empty answer matched it (reward 1.0, a reward over
    nothing). validate refuses such rows naming them, and the reward gives them no credit."""
    from leap_finetune.rl.rewards import accuracy
    from tests.conftest import grpo_rows_config, invoke, write_config

    assert accuracy(["", "...", "Paris"], ["...", "?!", "paris."]) == [0.0, 0.0, 1.0]
    rows = [{"prompt": "Capital of France?", "solution": "Paris"}] * 3 + [{"prompt": "And?", "solution": "..."}]
    config = grpo_rows_config(tmp_path, rows, ["accuracy"])
    result = invoke("validate", str(write_config(tmp_path, config)))
    said = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr
    assert "g.jsonl, line 4" in said and "solution" in said and "'...' is nothing once the accuracy reward" in said
    assert "line 1" not in said
    # the same rows under a reward that does not read the solution are fine
    config["rewards"] = [{"name": "length", "target_tokens": 8}]
    assert invoke("validate", str(write_config(tmp_path, config))).returncode == 0


def test_a_prompt_without_a_solution_is_refused_where_every_reward_needs_one(tmp_path):
    """Every reward scoring against `solution` (accuracy here) gave such a row None: TRL warned at every step
    ("All reward functions returned None") and the prompt trained nothing. validate names the row; beside a reward
    that needs no solution the row is scored by that one, and is fine."""
    from tests.conftest import grpo_rows_config, invoke, write_config

    rows = [{"prompt": "Capital of France?", "solution": "Paris"}] * 3 + [
        {"prompt": "hi"},
        {"prompt": "yo", "solution": " "},
    ]
    config = grpo_rows_config(tmp_path, rows, ["accuracy"])
    result = invoke("validate", str(write_config(tmp_path, config)))
    said = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in said, result.stderr
    assert "g.jsonl, line 4, line 5" in said and "field 'solution'" in said and "line 1" not in said, said
    assert "every reward of this run (accuracy) scores a completion against it" in said
    config["rewards"] = ["accuracy", {"name": "length", "target_tokens": 8}]
    assert invoke("validate", str(write_config(tmp_path, config))).returncode == 0
