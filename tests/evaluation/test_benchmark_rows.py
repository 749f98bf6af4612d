"""Every benchmark row is validated up front: file, row and field for each problem."""

from __future__ import annotations

import json

import pytest

from leap_finetune.config.schema_evals import BenchmarkConfig
from leap_finetune.errors import DataError
from leap_finetune.evaluation.rows import load_benchmark

U = {"role": "user", "content": "Question?"}
A = {"role": "assistant", "content": "Answer."}


def load(tmp_path, rows, metric="exact_match", vision=False):
    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_benchmark(
        BenchmarkConfig(name="b", path=str(path), metric=metric), vision=vision, model_name="tiny-lfm2"
    )


def test_the_spec_formats_load(tmp_path):
    (tmp_path / "img.jpg").write_bytes(b"\xff\xd8")
    generation = load(
        tmp_path,
        [
            {
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "Hi?"}]},
                    {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                ]
            }
        ],
    )
    assert generation[0].prompt == [{"role": "user", "content": "Hi?"}] and generation[0].reference == "Hello."
    mcq = load(tmp_path, [{"messages": [U], "options": ["cat", "dog", "bird"], "answer_id": 1}], metric="logprob_mcq")
    assert mcq[0].options == ["cat", "dog", "bird"] and mcq[0].answer_id == 1


CASES = [
    (
        "no assistant turn in a generation benchmark",
        [{"messages": [U]}],
        "exact_match",
        "messages",
        "no assistant turn",
    ),
    (
        "answer_id out of range",
        [{"messages": [U], "options": ["a", "b"], "answer_id": 2}],
        "logprob_mcq",
        "answer_id",
        "out of range",
    ),
    (
        "answer_id not an integer",
        [{"messages": [U], "options": ["a", "b"], "answer_id": "1x"}],
        "logprob_mcq",
        "answer_id",
        "integer",
    ),
    ("one option", [{"messages": [U], "options": ["a"], "answer_id": 0}], "logprob_mcq", "options", "at least two"),
    (
        "empty option",
        [{"messages": [U], "options": ["a", " "], "answer_id": 0}],
        "logprob_mcq",
        "options[1]",
        "non-empty",
    ),
    (
        "bad content part",
        [{"messages": [{"role": "user", "content": [{"type": "video"}]}, A]}],
        "exact_match",
        "messages[0].content[0]",
        "expected",
    ),
    (
        "missing image file",
        [{"messages": [{"role": "user", "content": [{"type": "image", "image": "nope.jpg"}]}, A]}],
        "exact_match",
        "messages[0].content[0]",
        "image file not found",
    ),
    (
        "log-prob row ending with the answer",
        [{"messages": [U, A], "options": ["a", "b"], "answer_id": 0}],
        "logprob_mcq",
        "messages",
        "ends with an assistant turn",
    ),
    ("no messages", [{"question": "x"}], "exact_match", "messages", "missing or empty"),
]


@pytest.mark.parametrize(("name", "rows", "metric", "field", "message"), CASES, ids=[c[0] for c in CASES])
def test_invalid_benchmark_rows(tmp_path, name, rows, metric, field, message):
    with pytest.raises(DataError) as info:
        load(tmp_path, rows, metric)
    problems = info.value.problems
    assert any(p.field == field and message in p.problem for p in problems), [p.format() for p in problems]
    assert problems[0].location == "line 1" and problems[0].file.endswith("bench.jsonl")
    assert "benchmark 'b'" in info.value.format()


def test_image_rows_with_a_text_only_model_name_the_benchmark_and_row(tmp_path):
    (tmp_path / "img.jpg").write_bytes(b"\xff\xd8")
    rows = [
        {"messages": [U, A]},
        {
            "messages": [
                {"role": "user", "content": [{"type": "image", "image": "img.jpg"}, {"type": "text", "text": "What?"}]},
                A,
            ]
        },
    ]
    with pytest.raises(DataError) as info:
        load(tmp_path, rows)
    [problem] = info.value.problems
    assert problem.location == "line 2" and "text-only" in problem.problem and "benchmark 'b'" in problem.problem


def test_validate_an_evaluation_only_config(tmp_path):
    from leap_finetune.api import validate_config

    (tmp_path / "bench.jsonl").write_text(json.dumps({"messages": [U]}) + "\n")
    config = {
        "model_name": "tiny-lfm2",
        "evals": {"benchmarks": [{"name": "b", "path": str(tmp_path / "bench.jsonl"), "metric": "exact_match"}]},
    }
    with pytest.raises(DataError, match="no assistant turn"):
        validate_config(config)
    config["evals"]["benchmarks"][0]["metric"] = "short_answer"
    (tmp_path / "bench.jsonl").write_text(json.dumps({"messages": [U, A]}) + "\n")
    assert validate_config(config) is None


def test_image_parts_resolve_files_against_the_benchmark_and_keep_urls(tmp_path):
    (tmp_path / "img.jpg").write_bytes(b"\xff\xd8")
    url = "https://example.com/pictures/dog.jpg"
    content = [
        {"type": "image", "image": "img.jpg"},
        {"type": "image", "image": url},
        {"type": "text", "text": "Same?"},
    ]
    [item] = load(tmp_path, [{"messages": [{"role": "user", "content": content}, A]}], vision=True)
    assert item.images == [str(tmp_path / "img.jpg"), url]
    assert item.prompt == [{"role": "user", "content": "<image><image>Same?"}]
