"""metric: tool_call through `leap-finetune eval`: reference turns in LFM notation or OpenAI's structured tool_calls,
the row's tools rendered into the prompt, the sub-scores logged beside the score and kept per row, and the mistakes
in such rows refused before a model loads."""

from __future__ import annotations

import json

from tests.conftest import invoke, write_config, write_jsonl

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
          "properties": {"city": {"type": "string"}}}}}]  # fmt: skip


def _rows():
    ask = {"role": "user", "content": "Weather in Oslo?"}
    return [
        {"messages": [ask, {"role": "assistant", "content": '<|tool_call_start|>[get_weather(city="Oslo")]<|tool_call_end|>'}],
         "tools": TOOLS},
        {"messages": [ask, {"role": "assistant", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}], "tools": json.dumps(TOOLS)},
        {"messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "hi"}]},
    ]  # fmt: skip


def test_tool_call_benchmark_logs_its_sub_scores_and_keeps_them_per_row(workdir):
    write_jsonl(workdir / "calls.jsonl", _rows())
    config = write_config(
        workdir,
        {"model_name": "tiny-lfm2", "evals": {"max_new_tokens": 12, "benchmarks": [
            {"name": "calls", "path": "calls.jsonl", "metric": "tool_call", "tool_call_order": "ordered"}]}},
    )  # fmt: skip
    result = invoke("eval", str(config), "--output", str(workdir / "results.json"))
    assert result.returncode == 0, result.stderr
    found = json.loads((workdir / "results.json").read_text())["results"]
    for key in ("score", "exact", "parsed", "name", "argument_f1", "no_call", "rows"):
        assert f"benchmark/calls/{key}" in found, key
    assert found["benchmark/calls/rows"] == 3
    rows = [json.loads(line) for line in (workdir / "results.predictions" / "calls.jsonl").read_text().splitlines()]
    # the score is recomputed here from each row's own prediction and reference
    from leap_finetune.data.tool_call_score import score_turn
    from leap_finetune.data.tool_calls import ToolCall

    expected = [[ToolCall("get_weather", {"city": "Oslo"})]] * 2 + [[]]
    direct = [score_turn(row["prediction"], calls, order="ordered").exact for row, calls in zip(rows, expected)]
    assert found["benchmark/calls/score"] == sum(direct) / 3
    assert "no_call" in rows[2] and "argument_f1" in rows[0] and "no_call" not in rows[0]
    # both reference forms hold the same call, and the tools were rendered into the prompt
    assert rows[0]["reference"] == rows[1]["reference"]
    assert "get_weather" in rows[0]["prompt"] and "get_weather" not in rows[2]["prompt"]


def test_tool_call_rows_and_keys_are_checked_before_a_model_loads(workdir):
    write_jsonl(
        workdir / "bad.jsonl",
        [{"messages": [{"role": "user", "content": "x"},
                       {"role": "assistant", "content": "<|tool_call_start|>[get_weather(city=Oslo)]<|tool_call_end|>"}]},
         {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "ok"}], "tools": "not json"}],
    )  # fmt: skip
    config = write_config(
        workdir,
        {
            "model_name": "tiny-lfm2",
            "evals": {"benchmarks": [{"name": "b", "path": "bad.jsonl", "metric": "tool_call"}]},
        },
    )
    for command in ("validate", "eval"):
        result = invoke(command, str(config))
        assert result.returncode == 2, result.stderr
        assert "does not parse" in result.stderr and "bad.jsonl" in result.stderr and "tools" in result.stderr
    wrong_key = write_config(
        workdir,
        {"model_name": "tiny-lfm2", "evals": {"benchmarks": [
            {"name": "b", "path": "bad.jsonl", "metric": "exact_match", "tool_call_order": "set"}]}},
        name="wrong.yaml",
    )  # fmt: skip
    result = invoke("validate", str(wrong_key))
    assert result.returncode == 2 and "tool_call_order goes with metric: tool_call" in result.stderr


def test_a_tool_call_benchmark_without_a_single_call_is_refused_not_scored_perfect(workdir):
    """Was: every model that calls no tool scored 1.000 on it. Rows without a call beside rows with one still
    count (the cases where no call is right)."""
    no_calls = [{"messages": [{"role": "user", "content": f"Say hi {i}."}, {"role": "assistant", "content": "hi"}]}
                for i in range(3)]  # fmt: skip
    write_jsonl(workdir / "none.jsonl", no_calls)
    write_jsonl(workdir / "mixed.jsonl", _rows())
    for path, code in (("none.jsonl", 2), ("mixed.jsonl", 0)):
        bench = {"name": "calls", "path": path, "metric": "tool_call"}
        config = write_config(
            workdir, {"model_name": "tiny-lfm2", "evals": {"max_new_tokens": 4, "benchmarks": [bench]}}
        )
        result = invoke("eval", str(config))
        assert result.returncode == code, result.stderr
        if code:
            text = " ".join(result.stderr.split())
            assert "none of its 3 row(s) has a tool call in its reference turn" in text and "1.000" in text, text
            assert "Traceback" not in result.stderr
