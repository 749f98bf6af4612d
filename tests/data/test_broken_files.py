"""A corpus of broken files: each is reported with file, row/line, field and what was expected -
never as a library traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leap_finetune.api import validate_config
from leap_finetune.errors import DataError, LeapError
from tests.conftest import chat, row_texts, tiny_config, write_jsonl

BROKEN = Path(__file__).parent / "broken"

CASES = [
    # file, substrings the message must contain
    ("broken_json_line.jsonl", ["broken_json_line.jsonl", "line 2", "not valid JSON"]),
    ("empty.jsonl", ["empty.jsonl", "the file is empty"]),
    ("messages_not_a_list.jsonl", ["line 1", "field 'messages'", "expected a list of messages, got a string"]),
    ("missing_content.json", ["row 2", "field 'messages[0].content'", "missing"]),
    ("truncated_array.json", ["truncated_array.json", "not valid JSON", "line 1"]),
    ("bad_json_cell.csv", ["row 2 (line 3)", "field 'messages'", "expected JSON text"]),
    ("no_messages_column.csv", ["row 1", "no 'messages' list", "columns found: prompt, answer"]),
    ("not_parquet.parquet", ["not_parquet.parquet", "cannot read the Parquet file"]),
    ("int_messages.parquet", ["row 1", "field 'messages'", "got a number (1)"]),
    ("image_part.jsonl", ["field 'messages[0].content[0]'", "an image part needs a vision-language model"]),
    ("empty_assistant.jsonl", ["field 'messages[1].content'", "assistant message is empty"]),
    ("unknown_message_key.jsonl", ["field 'messages[0].weight'", "unknown message key"]),
    ("row_not_object.json", ["row 1", "field '<row>'", "expected an object"]),
    ("not_utf8.jsonl", ["not_utf8.jsonl", "not UTF-8"]),
]


@pytest.mark.parametrize(("name", "expected"), CASES, ids=[c[0] for c in CASES])
def test_broken_file_is_reported_precisely(name, expected):
    config = tiny_config(data=str(BROKEN / name))
    with pytest.raises(LeapError) as info:
        validate_config(config)
    message = info.value.format()
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"


def test_the_corpus_reads_the_same_with_several_processes():
    """The same message for every broken file whether one process or two check the rows."""
    for name, _ in CASES:
        messages = []
        for processes in (1, 2):
            config = tiny_config(data=str(BROKEN / name), dataset={"path": str(BROKEN / name), "num_proc": processes})
            with pytest.raises(LeapError) as info:
                validate_config(config)
            messages.append(info.value.format())
        assert messages[0] == messages[1], name


def test_every_row_is_validated_and_the_first_20_listed_with_a_total(tmp_path):
    rows = [chat("q", "a") for _ in range(100)]
    bad_lines = list(range(5, 100, 3))  # 32 bad rows spread through the file, each with its own mistake
    for i in bad_lines:
        rows[i] = {"messages": [{"role": f"robot{i}", "content": "x"}]}
    write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError) as info:
        validate_config(tiny_config(data=str(tmp_path / "train.jsonl")))
    error = info.value
    assert len(error.problems) == len(bad_lines)
    assert [p.location for p in error.problems] == [f"line {i + 1}" for i in bad_lines]
    message = error.format()
    assert f"{len(bad_lines)} problem(s) in {len(bad_lines)} of 100 dataset row(s)" in message
    assert message.count("is not a role") == 20
    assert f"... and {len(bad_lines) - 20} more problem(s)" in message


def test_the_same_problem_in_many_rows_is_one_line_with_the_rows(tmp_path):
    rows = [chat("q", "a") for _ in range(40)]
    for i in range(10, 40):
        rows[i] = {"messages": [{"role": "user", "content": "q"}]}
    write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError) as info:
        validate_config(tiny_config(data=str(tmp_path / "train.jsonl")))
    message = info.value.format()
    assert len(info.value.problems) == 30
    assert message.count("no assistant message") == 1
    assert "line 11, line 12, line 13, line 14, line 15 and 25 more (30 rows), field 'messages'" in message


def test_on_invalid_skip_drops_and_lists_bad_rows(tmp_path):
    rows = [chat(f"q{i}", f"a{i}") for i in range(10)]
    rows[3] = {"messages": [{"role": "user", "content": "no answer"}]}
    write_jsonl(tmp_path / "train.jsonl", rows)
    prepared = validate_config(
        tiny_config(
            data=str(tmp_path / "train.jsonl"), dataset={"path": str(tmp_path / "train.jsonl"), "on_invalid": "skip"}
        )
    )
    assert len(prepared.train) == 9
    assert prepared.invalid_skipped == 1
    assert prepared.dropped[0].location == "line 4" and "no assistant message" in prepared.dropped[0].reason


def test_formats_jsonl_json_csv_parquet_and_folder_read_the_same_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [chat(f"question {i}", f"answer {i}") for i in range(6)]
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", rows[:2])
    (folder / "b.json").write_text(json.dumps(rows[2:4]))
    (folder / "c.csv").write_text(
        "messages\n" + "".join('"' + json.dumps(r["messages"]).replace('"', '""') + '"\n' for r in rows[4:5])
    )
    pq.write_table(pa.Table.from_pylist(rows[5:6]), folder / "d.parquet")
    prepared = validate_config(tiny_config(data=str(folder)))
    texts = row_texts(prepared.train)
    assert len(texts) == 6
    for i in range(6):
        assert f"question {i}<|im_end|>" in texts[i]
        assert f"answer {i}<|im_end|>" in texts[i]


def test_aliases_and_typed_text_parts(tmp_path):
    rows = [
        {"conversations": [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hi"}]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            ]
        },
    ]
    write_jsonl(tmp_path / "train.jsonl", rows)
    prepared = validate_config(tiny_config(data=str(tmp_path / "train.jsonl")))
    assert "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>" in row_texts(prepared.train)[0]
    assert "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\nok<|im_end|>" in row_texts(prepared.train)[1]


def test_limit_and_test_size_and_val_path(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [chat(f"q{i}", f"a{i}") for i in range(50)])
    write_jsonl(tmp_path / "val.jsonl", [chat(f"v{i}", f"b{i}") for i in range(7)])
    prepared = validate_config(
        tiny_config(dataset={"path": str(tmp_path / "train.jsonl"), "limit": 20, "test_size": 0.25})
    )
    assert (len(prepared.train), len(prepared.eval)) == (15, 5)
    prepared = validate_config(tiny_config(dataset={"path": str(tmp_path / "train.jsonl"), "test_size": 10}))
    assert (len(prepared.train), len(prepared.eval)) == (40, 10)
    prepared = validate_config(
        tiny_config(dataset={"path": str(tmp_path / "train.jsonl"), "val_path": str(tmp_path / "val.jsonl")})
    )
    assert (len(prepared.train), len(prepared.eval)) == (50, 7)
    assert "v0" in row_texts(prepared.eval)[0]
    # the report counts each file's rows apart: the held-out file's are not read from the training file
    [source] = prepared.sources
    assert (source.rows_read, source.valid, source.train_rows, source.eval_rows) == (50, 50, 50, 7)
    assert (source.val_path, source.val_rows_read, source.val_valid) == (str(tmp_path / "val.jsonl"), 7, 7)


def test_unreachable_hub_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(LeapError, match="cannot load the Hugging Face dataset 'nobody/nothing'"):
        validate_config(tiny_config(data="nobody/nothing"))
