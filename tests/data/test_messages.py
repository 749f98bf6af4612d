"""The one parser of messages and content parts (data/messages.py): each caller's words for each refused
part, image parts read as references (resolved files, kept URLs, `<image>` in the text), and every row
type - SFT, DPO, KTO, GRPO, benchmark - going through it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from leap_finetune.config.schema_evals import BenchmarkConfig
from leap_finetune.data.grpo_rows import check_grpo_row
from leap_finetune.data.messages import (
    IMAGE_PLACEHOLDER,
    Content,
    ImageRef,
    check_message,
    check_tools,
    describe_value,
    parse_content,
)
from leap_finetune.data.preference_rows import check_dpo_row, check_kto_row
from leap_finetune.data.readers import SourceRow
from leap_finetune.data.sft_rows import check_sft_row
from leap_finetune.errors import DataError
from leap_finetune.evaluation.rows import load_benchmark

SRC = Path(__file__).resolve().parents[2] / "src" / "leap_finetune"


def parse(content, image_folder=None):
    problems = []
    result = parse_content(content, "m[0].content", lambda f, t: problems.append((f, t)), image_folder=image_folder)
    return result, problems


def test_describe_value():
    assert [describe_value(v) for v in (None, True, 3, 2.5, "abc", [], {}, (1,))] == [
        "null",
        "a boolean",
        "a number (3)",
        "a number (2.5)",
        "a string ('abc')",
        "a list",
        "an object",
        "tuple",
    ]
    assert describe_value("x" * 50) == f"a string ({'x' * 37 + '...'!r})"


def test_text_parts_are_joined_into_one_string():
    assert parse("Hi") == (Content("Hi"), [])
    assert parse([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == (Content("ab"), [])


TEXT_ONLY = [
    (
        {"type": "image", "image": "x.jpg"},
        "m[0].content[0]",
        "an image part needs a vision-language model (model_name: an LFM2-VL model such as LiquidAI/LFM2-VL-450M) and training_type sft, dpo or grpo; this run reads text only",
    ),
    (
        {"type": "audio"},
        "m[0].content[0]",
        "a 'audio' part needs an audio/video model; leap-finetune trains on text and images",
    ),
    ({"type": "html"}, "m[0].content[0]", "unknown part type 'html'; expected 'text'"),
    ("hi", "m[0].content[0]", 'expected a typed part like {"type": "text", "text": "..."}, got a string (\'hi\')'),
    ({"text": "hi"}, "m[0].content[0]", 'expected a typed part like {"type": "text", "text": "..."}, got an object'),
    ({"type": "text", "text": 3}, "m[0].content[0].text", "a text part needs a string 'text', got a number (3)"),
]


@pytest.mark.parametrize(("part", "field", "text"), TEXT_ONLY)
def test_a_text_only_caller_says_what_is_wrong_with_the_part(part, field, text):
    assert parse([part]) == (None, [(field, text)])


@pytest.mark.parametrize("part", [{"type": "video"}, {"type": "text", "text": 3}, "hi"])
def test_a_caller_that_takes_images_says_what_both_kinds_of_part_look_like(tmp_path, part):
    expected = 'expected {"type": "text", "text": ...} or {"type": "image", "image": path}'
    assert parse([part], tmp_path) == (None, [("m[0].content[0]", expected)])


def test_content_that_is_neither_a_string_nor_a_list():
    assert parse(None) == (None, [("m[0].content", "expected a string or a list of typed parts, got null")])
    assert parse({"text": "x"})[1] == [("m[0].content", "expected a string or a list of typed parts, got an object")]


def test_image_parts_are_references_resolved_against_the_folder_with_urls_kept(tmp_path):
    (tmp_path / "img.jpg").write_bytes(b"\xff\xd8")
    url = "https://example.com/dog.jpg"
    content = [
        {"type": "image", "image": "img.jpg"},
        {"type": "text", "text": "Same as"},
        {"type": "image", "url": url},
        {"type": "text", "text": "?"},
    ]
    result, problems = parse(content, tmp_path)
    assert problems == []
    assert result.text == f"{IMAGE_PLACEHOLDER}Same as{IMAGE_PLACEHOLDER}?" == "<image>Same as<image>?"
    assert result.images == [ImageRef(str(tmp_path / "img.jpg"), "m[0].content[0]"), ImageRef(url, "m[0].content[2]")]


def test_image_parts_without_a_source_or_file(tmp_path):
    needs = "an image part needs 'image': a file path, a data URI or base64 text"
    assert parse([{"type": "image"}], tmp_path) == (None, [("m[0].content[0]", needs)])
    assert parse([{"type": "image_url"}], tmp_path) == (None, [("m[0].content[0]", needs)])
    where = f"relative image paths start at {tmp_path}: the data file's folder, or the image_root key - dataset."
    assert parse([{"type": "image", "path": "nope.jpg"}], tmp_path) == (
        None,
        [
            (
                "m[0].content[0]",
                f"image file not found: {tmp_path / 'nope.jpg'} ({where}image_root; a benchmark's "
                "image_root or evals.image_root)",
            )
        ],
    )


def test_a_relative_image_path_found_in_the_current_folder_names_dataset_image_root(tmp_path, monkeypatch):
    """Paths written relative to where the command runs: every row fails alike, and the error names the key."""
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "cat.png").write_bytes(b"not read here")
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    _, problems = parse([{"type": "image", "path": "pics/cat.png"}], tmp_path / "data")
    [(field, text)] = problems
    assert text.startswith(f"image file not found: {tmp_path / 'data' / 'pics' / 'cat.png'}; relative image paths")
    assert f"{tmp_path / 'pics' / 'cat.png'} exists: set image_root: {tmp_path} (dataset.image_root;" in text
    assert parse([{"type": "image", "path": str(tmp_path / "gone.png")}], tmp_path)[1] == [
        ("m[0].content[0]", f"image file not found: {tmp_path / 'gone.png'}")  # (an absolute path: no hint)
    ]
    long = "\u00e9" * 150 + ".png"  # (200 characters or fewer, over the file system's 255 bytes: no traceback)
    [(_, text)] = parse([{"type": "image", "path": long}], tmp_path)[1]
    assert text.startswith("image file not found") and "relative image paths start at" in text
    for address in ("s3://bucket/cat.png", "file:///tmp/cat.png", "gs://b/c.jpg"):
        [(_, text)] = parse([{"type": "image", "path": address}], tmp_path)[1]
        assert f"({address})" in text and "reads image files, data URIs and http(s) URLs" in text, text


def test_check_message_normalises_sharegpt_and_null_content_of_a_tool_call():
    problems = []

    def problem(field, text):
        problems.append((field, text))

    assert check_message({"from": "gpt", "value": [{"type": "text", "text": "Hi"}]}, "m[1]", problem) == {
        "role": "assistant",
        "content": "Hi",
    }
    calls = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert check_message({"role": "assistant", "content": None, "tool_calls": calls}, "m[1]", problem) == {
        "role": "assistant",
        "content": "",
        "tool_calls": calls,
    }
    assert problems == []


def test_check_tools_reads_json_text_from_csv():
    problems = []
    tools = check_tools(json.dumps([{"name": "get_weather"}]), True, lambda f, t: problems.append((f, t)))
    assert tools == [{"name": "get_weather"}] and problems == []
    assert check_tools({"name": "x"}, False, lambda f, t: problems.append((f, t))) is None
    assert problems == [("tools", "expected a list of tool definitions (JSON schemas), got an object")]


IMAGE = [{"type": "image", "image": "img.jpg"}, {"type": "text", "text": "What is it?"}]
REFUSED = "an image part needs a vision-language model (model_name: an LFM2-VL model such as LiquidAI/LFM2-VL-450M) and training_type sft, dpo or grpo; this run reads text only"


def test_every_training_row_type_refuses_image_parts_in_the_same_words():
    user, answer = {"role": "user", "content": IMAGE}, {"role": "assistant", "content": "A cat."}
    rows = {
        "sft": (check_sft_row, {"messages": [user, answer]}, "messages[0].content[0]"),
        "dpo": (
            check_dpo_row,
            {"prompt": [user], "chosen": [answer], "rejected": [{"role": "assistant", "content": "A dog."}]},
            "prompt[0].content[0]",
        ),
        "kto": (check_kto_row, {"prompt": [user], "completion": [answer], "label": True}, "prompt[0].content[0]"),
        "grpo": (check_grpo_row, {"prompt": [user], "solution": "cat"}, "prompt[0].content[0]"),
    }
    for name, (check, data, field) in rows.items():
        result, problems, _ = check(SourceRow("d.jsonl", "line 1", data), family="lfm2")
        assert result is None and [(p.field, p.problem) for p in problems] == [(field, REFUSED)], name


def test_benchmark_rows_take_image_parts_through_the_same_parser(tmp_path):
    (tmp_path / "img.jpg").write_bytes(b"\xff\xd8")
    path = tmp_path / "bench.jsonl"
    path.write_text(
        json.dumps({"messages": [{"role": "user", "content": IMAGE}, {"role": "assistant", "content": "A cat."}]})
        + "\n"
    )
    bench = BenchmarkConfig(name="b", path=str(path), metric="exact_match")
    [item] = load_benchmark(bench, vision=True, model_name="tiny-lfm2-vl")
    assert item.prompt == [{"role": "user", "content": "<image>What is it?"}]
    assert item.images == [str(tmp_path / "img.jpg")]
    with pytest.raises(DataError, match="text-only"):
        load_benchmark(bench, vision=False, model_name="tiny-lfm2")


ROW_MODULES = [
    "data/messages.py",
    "data/sft_rows.py",
    "data/preference_rows.py",
    "data/grpo_rows.py",
    "data/retrieval_rows.py",
    "evaluation/rows.py",
]


@pytest.mark.parametrize("module", ROW_MODULES)
def test_row_modules_import_no_private_name_of_another_module(module):
    tree = ast.parse((SRC / module).read_text())
    private = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("leap_finetune")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert private == []
