"""`dataset.hold_out_tools`: every row that names a held-out tool - calls it (LFM notation or structured), lists it in
a `tools` column or in the system prompt's tool list - is out of the training and evaluation rows of every source
(val_path too), and each of its tool-calling turns is a row of the `unseen_tools` benchmark; the data report says
which tools went where; the mistakes are refused by `validate` with where and how to fix."""

from __future__ import annotations

import io
import json

import yaml
from rich.console import Console

from leap_finetune.api import validate_config
from tests.conftest import invoke, row_texts, tiny_config, write_config, write_jsonl


def _tool(name: str) -> dict:
    return {"name": name, "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}


def _call(name: str, x: str) -> str:
    return f'<|tool_call_start|>[{name}(x="{x}")]<|tool_call_end|>'


def _turns(name: str, x: str, answer: str = "done") -> list[dict]:
    return [
        {"role": "assistant", "content": _call(name, x)},
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": answer},
    ]


def _rows() -> tuple[list[dict], list[dict]]:
    """(training rows, val rows): 10 + 10 rows without the held-out tool, 4 + 1 naming it, each another way."""
    weather = [{"tools": [_tool("get_weather"), _tool("get_time")],
                "messages": [{"role": "user", "content": f"weather {i}"}, *_turns("get_weather", f"c{i}")]}
               for i in range(10)]  # fmt: skip
    plain = [{"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "hello"}]}
             for i in range(10)]  # fmt: skip
    held = [
        # called in LFM notation
        {"tools": [_tool("get_stock_price"), _tool("get_time")],
         "messages": [{"role": "user", "content": "price?"}, *_turns("get_stock_price", "AAPL")]},
        # called in OpenAI's structured form, then another tool in a second turn: two benchmark rows
        {"tools": [_tool("get_stock_price"), _tool("get_time")],
         "messages": [{"role": "user", "content": "price and time?"},
                      {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
                          "name": "get_stock_price", "arguments": {"x": "NVDA"}}}]},
                      {"role": "tool", "content": "{}"},
                      {"role": "user", "content": "and the time?"},
                      *_turns("get_time", "Oslo")]},
        # only listed among the row's tool definitions; another tool is called
        {"tools": [_tool("get_weather"), _tool("get_stock_price")],
         "messages": [{"role": "user", "content": "weather?"}, *_turns("get_weather", "Lima")]},
        # only in the system prompt's tool list (LFM2's markers)
        {"messages": [{"role": "system", "content": "List of tools: <|tool_list_start|>"
                       + json.dumps([_tool("get_stock_price")]) + "<|tool_list_end|>"},
                      {"role": "user", "content": "time?"}, *_turns("get_time", "Rome")]},
    ]  # fmt: skip
    val = [weather[0], held[0]]
    return weather + plain + held, val


def _config(tmp_path, **dataset) -> dict:
    train, val = _rows()
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "val.jsonl", val)
    return tiny_config(
        dataset={
            "path": str(tmp_path / "train.jsonl"),
            "hold_out_tools": ["get_stock_price"],
            "cache": False,
            **dataset,
        },
        training_config={"max_length": 512},
    )


def test_rows_naming_a_held_out_tool_leave_every_split_and_become_the_benchmark(tmp_path):
    out = io.StringIO()
    prepared = validate_config(
        _config(tmp_path, val_path=str(tmp_path / "val.jsonl")), console=Console(file=out, width=200)
    )
    texts = row_texts(prepared.train.table) + row_texts(prepared.eval.table)
    assert len(prepared.train) == 20 and len(prepared.eval) == 1  # (val.jsonl: its held-out row is out too)
    assert not any("get_stock_price" in text for text in texts)
    assert prepared.tool_held_rows == 5  # 4 rows of train.jsonl, 1 of val.jsonl
    # one benchmark row per turn that calls the held-out tool: 1 + 1 (the structured row's call of get_time is
    # left out: a seen tool), none from the rows that only list it, + 1 from val.jsonl
    rows = prepared.unseen_tool_rows
    assert len(rows) == 3
    for row in rows:
        assert row["messages"][-1]["role"] == "assistant" and "held_out_from" in row
    structured = next(r for r in rows if "NVDA" in r["messages"][-1]["content"])  # (converted to LFM notation)
    assert [m["role"] for m in structured["messages"]] == ["user", "assistant"]
    assert structured["messages"][-1]["content"].startswith('<|tool_call_start|>[get_stock_price(x="NVDA")]')
    assert prepared.tool_split["get_stock_price"] == {"train": 0, "eval": 0, "held_out": 5}
    assert prepared.tool_split["get_weather"]["held_out"] == 1 and prepared.tool_split["get_time"]["held_out"] == 4
    assert prepared.tool_split["get_weather"]["train"] + prepared.tool_split["get_weather"]["eval"] == 11
    report = out.getvalue()
    assert "get_stock_price (held out)" in report and "3 turn(s) calling one" in report and "5 row(s)" in report


def test_a_run_scores_the_held_out_rows_as_benchmark_unseen_tools(tmp_path):
    config = _config(tmp_path)
    config["training_config"].update(max_steps=2, save_strategy="no")
    path = write_config(tmp_path, config)
    result = invoke(str(path), "--set", f"output_dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr
    run = tmp_path / "run"
    written = [json.loads(line) for line in (run / "prepared" / "unseen_tools.jsonl").read_text().splitlines()]
    assert len(written) == 2
    resolved = yaml.safe_load((run / "resolved_config.yaml").read_text())
    (bench,) = resolved["evals"]["benchmarks"]  # (the config had no evals: one is made for it)
    assert bench["name"] == "unseen_tools" and bench["metric"] == "tool_call"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("benchmark/unseen_tools/rows") == 2 for m in metrics)
    # `leap-finetune eval CONFIG --set checkpoint=RUN` scores it again from the run folder
    again = invoke("eval", str(path), "--set", f"checkpoint={run}", "--output", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "again.json").read_text())["results"]["benchmark/unseen_tools/rows"] == 2


def test_grpo_prompts_naming_a_held_out_tool_become_benchmark_rows_with_their_solution(tmp_path):
    rows = [{"prompt": f"weather {i}", "tools": [_tool("get_weather")], "solution": _call("get_weather", f"c{i}")}
            for i in range(8)]  # fmt: skip
    rows.append({"prompt": "price?", "tools": [_tool("get_stock_price")], "solution": _call("get_stock_price", "A")})
    write_jsonl(tmp_path / "grpo.jsonl", rows)
    config = tiny_config(
        training_type="grpo",
        dataset={"path": str(tmp_path / "grpo.jsonl"), "hold_out_tools": ["get_stock_price"], "cache": False},
        rewards=["tool_call_match"],
        training_config={
            "extends": "DEFAULT_GRPO",
            "use_vllm": False,
            "num_generations": 4,
            "per_device_train_batch_size": 4,
        },
    )
    del config["training_config"]["max_length"]  # (GRPO keeps prompts whole)
    prepared = validate_config(config, console=Console(file=io.StringIO()))
    assert len(prepared.train) == 8
    (row,) = prepared.unseen_tool_rows
    assert row["messages"] == [
        {"role": "user", "content": "price?"},
        {"role": "assistant", "content": _call("get_stock_price", "A")},
    ]


def test_hold_out_mistakes_are_refused_with_where_and_how(tmp_path):
    train, _ = _rows()
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "dpo.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}] * 4)
    base = tiny_config(dataset={"path": "train.jsonl"})

    def refused(dataset: dict, *contains: str, **extra) -> None:
        config = {**base, **extra, "dataset": {"path": "train.jsonl", **dataset}}
        result = invoke("validate", str(write_config(tmp_path, config)))
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        for text in contains:
            assert text in result.stderr, (text, result.stderr)

    refused({"hold_out_tools": ["get_stock_prise"]}, "get_stock_prise", "did you mean 'get_stock_price'", "get_weather")
    refused({"hold_out_tools": []}, "dataset.hold_out_tools")
    refused({"hold_out_tools": [""]}, "a tool name is empty")
    refused({"hold_out_tools": ["a", "a"]}, "named twice: a")
    refused({"hold_out_tools": "get_stock_price"}, "dataset.hold_out_tools")
    refused({"hold_out_tools": [3]}, "dataset.hold_out_tools")
    write_jsonl(tmp_path / "all.jsonl", train[:10])  # every row calls get_weather
    refused(
        {"path": "all.jsonl", "hold_out_tools": ["get_weather"]}, "names a held-out tool", "no training rows are left"
    )
    # the same with a test_size: the hold-out's message, not the split's
    refused({"path": "all.jsonl", "hold_out_tools": ["get_weather"], "test_size": 0.2}, "names a held-out tool")
    listed = {"tools": [_tool("get_stock_price")], "messages": [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": "hello"}]}  # fmt: skip
    write_jsonl(tmp_path / "listed.jsonl", train[:10] + [listed])  # named only among definitions, never called
    refused({"path": "listed.jsonl", "hold_out_tools": ["get_stock_price"]}, "no row calls a held-out tool")
    refused(
        {"path": "dpo.jsonl", "hold_out_tools": ["x"]},
        "holds out tool-calling rows of sft or grpo data; training_type is dpo",
        training_type="dpo",
        training_config={"extends": "DEFAULT_DPO"},
    )
    refused(
        {"hold_out_tools": ["get_stock_price"]},
        "benchmark 'unseen_tools' is the name of the benchmark",
        evals={"benchmarks": [{"name": "unseen_tools", "path": "train.jsonl", "metric": "tool_call"}]},
    )


def test_the_held_out_rows_come_back_from_the_data_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_FINETUNE_CACHE", str(tmp_path / "cache"))
    config = _config(tmp_path, cache=True)
    first = validate_config(config, console=Console(file=io.StringIO()))
    again = validate_config(config, console=Console(file=io.StringIO()))
    assert first.from_cache is None and again.from_cache is not None
    assert again.unseen_tool_rows == first.unseen_tool_rows and len(again.unseen_tool_rows) == 2
    assert again.tool_split == first.tool_split and again.tool_held_rows == first.tool_held_rows == 4
    # another held-out tool is other prepared data: not read from the same entry
    other = validate_config({**config, "dataset": {**config["dataset"], "hold_out_tools": ["get_time"]}},
                            console=Console(file=io.StringIO()))  # fmt: skip
    assert other.from_cache is None and other.tool_split["get_time"]["train"] == 0


def test_tool_names_in_every_place_a_row_holds_them():
    """LFM2.5's system tool list has lost its markers by the time the row is read (normalised): its names are read
    from the whole system prompt; a GRPO solution of structured calls (JSON text) is a tool_calls reference turn."""
    from leap_finetune.data.grpo_rows import GrpoRow
    from leap_finetune.data.held_out_tools import benchmark_rows, tools_named
    from leap_finetune.data.sft_rows import Conversation

    system = {"role": "system", "content": "Tools: " + json.dumps([_tool("get_stock_price")])}
    row = Conversation([system, {"role": "user", "content": "p?"}, *_turns("get_time", "x")])
    assert tools_named(row) == {"get_stock_price", "get_time"}
    solution = json.dumps([{"type": "function", "function": {"name": "get_stock_price", "arguments": {"x": "A"}}}])
    grpo = GrpoRow([{"role": "user", "content": "price?"}], solution, [_tool("get_stock_price")])
    assert tools_named(grpo) == {"get_stock_price"}
    (bench,) = benchmark_rows(grpo, "f.jsonl", "line 1", frozenset({"get_stock_price"}))
    assert bench["messages"][-1] == {"role": "assistant", "tool_calls": json.loads(solution)}
