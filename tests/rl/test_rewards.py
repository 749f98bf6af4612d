"""The built-in rewards, custom ones, and the judge's score parsing."""

from __future__ import annotations

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
    other = '<|tool_call_start|>[get_time()]<|tool_call_end|>'
    assert valid([call, other, "no call"], tools=[tools, tools, tools]) == [1.0, 0.0, 0.0]


def test_a_custom_reward_gets_the_rows_columns(tmp_path):
    (tmp_path / "r.py").write_text("def shout(completions, level=None, **kwargs):\n"
                                   "    return [float(c.isupper()) * l for c, l in zip(completions, level)]\n")
    shout = build_reward(f"{tmp_path / 'r.py'}::shout")
    assert shout(["HI", "hi"], level=[2.0, 3.0]) == [2.0, 0.0] and shout.__name__ == "shout"


@pytest.mark.parametrize(("answer", "score"), [('{"score": 8}', 8.0), ('Score: {"score": 6.5} ok', 6.5),
                                               ("I give it 7/10", 7.0), ("{'score': 3}", 3.0), ("great!", None),
                                               ('{"score": true} 4', 4.0)])
def test_judge_scores_are_read_from_json_or_the_first_number(answer, score):
    assert parse_score(answer) == score
