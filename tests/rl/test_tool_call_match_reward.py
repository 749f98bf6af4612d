"""GRPO's `tool_call_match` reward: the completion's calls against the solution turn's, with the benchmark metric's
scorer and partial credit; turns that should not call; rows without a solution are not scored."""

from __future__ import annotations

import pytest

from leap_finetune.rl.rewards import BUILTIN_REWARDS, tool_call_match

START, END = "<|tool_call_start|>", "<|tool_call_end|>"
GOLD = f'{START}[get_weather(city="Oslo", days=3)]{END}'


def test_partial_credit_follows_the_sub_scores():
    completions = [
        f'Checking. {START}[get_weather(days=3.0, city="Oslo")]{END}',  # exact (values, any key order)
        f'{START}[get_weather(city="Bergen", days=3)]{END}',  # name right, half the arguments
        f'{START}[get_time(zone="CET")]{END}',  # wrong function
        f'{START}[get_weather(city="Oslo"{END}',  # does not parse
        "It is sunny.",  # no call at all
    ]
    rewards = tool_call_match(completions, [GOLD] * len(completions))
    assert rewards[0] == 1.0
    assert rewards[1] == pytest.approx(0.5 * 0 + 0.25 * 1 + 0.25 * 0.5)
    assert rewards[2] == 0.0 and rewards[3] == 0.0 and rewards[4] == 0.0
    assert rewards[0] > rewards[1] > rewards[2]  # the order GRPO needs: closer calls earn more


def test_no_call_rows_and_rows_without_a_solution():
    assert tool_call_match(["Hello!", f"{START}[wave()]{END}"], ["Hi there.", "Hi there."]) == [1.0, 0.0]
    assert tool_call_match(["anything"], [None]) == [None]
    assert tool_call_match(["anything"], [""]) == [None]
    assert "tool_call_match" in BUILTIN_REWARDS


def test_the_tool_rewards_read_the_markers_trl_decodes_away():
    """TRL decodes completions without special tokens, and LFM's tool-call markers are special tokens: the built
    rewards decode the completion ids again with them (end-of-turn and padding dropped)."""
    from leap_finetune.models.loading import load_tokenizer
    from leap_finetune.rl.rewards import build_reward

    tokenizer = load_tokenizer("tiny-lfm2")
    turn = f'{START}[get_weather(city="Oslo", days=3)]{END}'
    ids = tokenizer(turn, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id, tokenizer.pad_token_id]
    as_trl_decodes = tokenizer.decode(ids, skip_special_tokens=True)
    assert START not in as_trl_decodes
    for name, expected in (("tool_call_match", 1.0), ("tool_call_valid", 1.0)):
        bare = build_reward(name)
        built = build_reward(name, tokenizer=tokenizer)
        kwargs = {"solution": [GOLD]} if name == "tool_call_match" else {}
        assert built([as_trl_decodes], completion_ids=[ids], **kwargs) == [expected]
        assert bare([as_trl_decodes], completion_ids=[ids], **kwargs) == [0.0]  # (what it scored before)
        assert built.__name__ == name


def test_a_custom_reward_that_asks_for_the_markers_gets_them(tmp_path):
    from leap_finetune.models.loading import load_tokenizer
    from leap_finetune.rl.rewards import build_reward

    (tmp_path / "r.py").write_text(
        "from leap_finetune.rl.rewards import tool_call_is_valid\n"
        "def calls_ok(completions, completions_with_markers, **kwargs):\n"
        "    return [1.0 if tool_call_is_valid(t) else 0.0 for t in completions_with_markers]\n"
        "def plain(completions, **kwargs):\n"
        "    return [float('completions_with_markers' in kwargs)] * len(completions)\n"
    )
    tokenizer = load_tokenizer("tiny-lfm2")
    ids = tokenizer(GOLD, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    reward = build_reward(f"{tmp_path / 'r.py'}::calls_ok", tokenizer=tokenizer)
    assert reward([text], completion_ids=[ids]) == [1.0]
    # a reward that does not name the parameter is called as before
    assert build_reward(f"{tmp_path / 'r.py'}::plain", tokenizer=tokenizer)([text], completion_ids=[ids]) == [0.0]


def test_solutions_are_read_in_every_form_and_unreadable_ones_named(tmp_path):
    import json

    from leap_finetune.data.tool_call_score import reference_calls
    from leap_finetune.data.tool_calls import ToolCall
    from tests.conftest import invoke, tiny_config, write_config, write_jsonl

    oslo = [ToolCall("get_weather", {"city": "Oslo", "days": 3})]
    structured = json.dumps(
        [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}}]
    )
    assert reference_calls(GOLD) == (oslo, None)
    assert reference_calls(structured) == (oslo, None)
    assert reference_calls("It is sunny.") == ([], None)
    assert reference_calls("<tool_call>{}</tool_call>")[1].startswith("a Hermes")
    assert "does not parse" in reference_calls(f"{START}[get_weather(city=Oslo)]{END}")[1]
    # the reward scores a structured solution as the same call (it rewarded not calling before)
    assert tool_call_match([GOLD, "It is sunny."], [structured, structured]) == [1.0, 0.0]

    rows = [{"prompt": "weather?", "solution": GOLD}] * 3 + [{"prompt": "w?", "solution": f"{START}[f(x=y)]{END}"}]
    write_jsonl(tmp_path / "g.jsonl", rows)
    write_jsonl(tmp_path / "none.jsonl", [{"prompt": "weather?"}] * 4)
    for data, expected in (("g.jsonl", ["g.jsonl, line 4", "solution", "tool_call_match cannot read it"]),
                           ("none.jsonl", ["none.jsonl, line 1", "every reward of this run (tool_call_match)"])):  # fmt: skip
        config = tiny_config(
            data=data, training_type="grpo", rewards=["tool_call_match"],
            training_config={"extends": "DEFAULT_GRPO", "use_vllm": False, "num_generations": 2,
                             "per_device_train_batch_size": 2},
        )  # fmt: skip
        del config["training_config"]["max_length"]
        result = invoke("validate", str(write_config(tmp_path, config)))
        assert result.returncode == 2, result.stderr
        for text in expected:
            assert text in result.stderr, (text, result.stderr)
