"""Data at scale: batched tokenization, several processes, the on-disk cache, Hub `limit`, several sources.

Each fast path is compared with the path it replaces (the per-row renderer, one process) on the same rows:
the same token ids, labels, problems, dropped rows and report."""

from __future__ import annotations

import io
import json
import os
import random

import pytest
from rich.console import Console

from leap_finetune.api import inspect_config, validate_config
from leap_finetune.data.chat_templates import load_chat_template
from leap_finetune.data.render import IGNORE_INDEX, Renderer, tokenize_many
from leap_finetune.data.sft_rows import Conversation
from leap_finetune.errors import DataError, LeapError
from leap_finetune.models.tiny import load_tiny_tokenizer
from leap_finetune.validate.loader import load_config
from tests.conftest import chat, tiny_config, write_config, write_jsonl

WORDS = ["the", "model", "héllo", "日本語", "emoji😀", "  spaced ", "tab\t", "new\nline", "<b>", "x" * 30, "42", "é"]


def _text(rng: random.Random, count: int) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(["", " ", "\n"]) for _ in range(count))


def _conversation(rng: random.Random) -> Conversation:
    messages = [{"role": "system", "content": _text(rng, 4)}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": _text(rng, rng.randint(1, 12))})
        # answers that start and end with multi-byte characters (split over several byte-level tokens)
        messages.append(
            {
                "role": "assistant",
                "content": rng.choice(["😀", "日本", ""])
                + _text(rng, rng.randint(1, 15))
                + rng.choice(["😀", "é", ""]),
            }
        )
    return Conversation(messages)


@pytest.mark.parametrize("loss_on", ["assistant", "final_assistant", "all"])
@pytest.mark.parametrize("template_name", ["lfm2", "lfm2.5"])
def test_batched_tokenization_equals_the_per_row_renderer(loss_on, template_name):
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    template = load_chat_template(template_name, tokenizer)
    rng = random.Random(7)
    conversations = [_conversation(rng) for _ in range(150)]
    for max_length, mode in ((None, "keep_start"), (40, "keep_start"), (40, "keep_end")):
        renderer = Renderer(tokenizer, template, loss_on, max_length, mode)
        assert renderer.boundary_masks  # the shortcut is what is being compared
        batched = tokenize_many(renderer, conversations)
        for conversation, fast in zip(conversations, batched, strict=True):
            row = renderer.tokenize(conversation.messages)
            assert fast.input_ids.tolist() == row.input_ids
            assert fast.labels.tolist() == row.labels
            assert fast.trained_tokens_lost == row.trained_tokens_lost
            assert fast.truncated == (row.truncated_at is not None)
        assert any((f.labels != IGNORE_INDEX).any() for f in batched)


def test_a_tokenizer_that_trims_offsets_uses_every_offset():
    """RoBERTa-style trim_offsets can leave gaps inside a span: the boundary shortcut is not used, and the
    rows are still the per-row renderer's."""
    from tokenizers import processors

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    tokenizer.backend_tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    renderer = Renderer(tokenizer, load_chat_template("lfm2", tokenizer), "assistant", None)
    assert not renderer.boundary_masks
    conversations = [_conversation(random.Random(i)) for i in range(30)]
    for conversation, fast in zip(conversations, tokenize_many(renderer, conversations), strict=True):
        row = renderer.tokenize(conversation.messages)
        assert fast.labels.tolist() == row.labels


def test_padding_and_truncation_saved_in_a_tokenizer_do_not_change_the_rows():
    """A tokenizer.json may carry padding and truncation; `tokenizer(text)` turns them off for its call, and the
    batched path must too (it calls the backend directly)."""
    saved = load_tiny_tokenizer("tiny-lfm2")
    saved.backend_tokenizer.enable_truncation(max_length=5)
    saved.backend_tokenizer.enable_padding(length=400)
    clean = load_tiny_tokenizer("tiny-lfm2")
    conversations = [_conversation(random.Random(i)) for i in range(20)]
    batched = tokenize_many(Renderer(saved, load_chat_template("lfm2", saved), "assistant", None), conversations)
    reference = Renderer(clean, load_chat_template("lfm2", clean), "assistant", None)
    for conversation, fast in zip(conversations, batched, strict=True):
        row = reference.tokenize(conversation.messages)
        assert fast.input_ids.tolist() == row.input_ids and fast.labels.tolist() == row.labels


def _mixed_rows(count: int) -> list:
    rng = random.Random(3)
    rows = []
    for i in range(count):
        if i % 97 == 5:
            rows.append({"messages": [{"role": "user", "content": "no answer"}]})  # invalid
        elif i % 211 == 7:
            rows.append({"messages": [{"role": "usr", "content": "typo"}, {"role": "assistant", "content": "a"}]})
        else:
            rows.append({"messages": _conversation(rng).messages})
    return rows


def _prepare(config: dict, processes: int):
    config = json.loads(json.dumps(config))
    config["dataset"]["num_proc"] = processes
    config["dataset"]["cache"] = False
    return validate_config(config, console=Console(file=io.StringIO()))


def test_several_processes_give_the_rows_problems_and_report_of_one(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", _mixed_rows(1500))
    (tmp_path / "train.jsonl").open("a").write("{not json\n")
    config = tiny_config(
        dataset={"path": str(path), "test_size": 0.1, "on_invalid": "skip"},
        training_config={"max_length": 160},
        samples=3,
    )
    one, two = _prepare(config, 1), _prepare(config, 2)
    assert (
        len(one.train) > 900 and one.invalid_skipped > 10 and one.fully_truncated > 10 and one.partially_truncated > 10
    )
    assert one.train.fingerprint() == two.train.fingerprint() and one.eval.fingerprint() == two.eval.fingerprint()
    assert [d.to_json() for d in one.dropped] == [d.to_json() for d in two.dropped]
    assert (
        (one.fully_truncated, one.partially_truncated, one.rows_read)
        == (two.fully_truncated, two.partially_truncated, two.rows_read)
        == (one.fully_truncated, one.partially_truncated, 1501)
    )
    assert [c.messages for c in one.sample_messages] == [c.messages for c in two.sample_messages]
    assert len(one.sample_messages) == 3
    assert one.train.examples == two.train.examples and len(one.train.examples) == 5
    assert [w.__dict__ for w in one.warnings] == [w.__dict__ for w in two.warnings]
    config["dataset"]["on_invalid"] = "error"
    errors = []
    for processes in (1, 2):
        with pytest.raises(DataError) as info:
            _prepare(config, processes)
        errors.append([(p.file, p.location, p.field, p.problem) for p in info.value.problems])
    assert errors[0] == errors[1] and len(errors[0]) == one.invalid_skipped
    assert errors[0][-1][1] == "line 1501" and "not valid JSON" in errors[0][-1][3]


def test_the_prepared_rows_are_arrow_int32_not_python_lists(tmp_path):
    import pyarrow as pa

    path = write_jsonl(tmp_path / "train.jsonl", [chat(f"q{i}", f"a{i}") for i in range(700)])
    prepared = _prepare(tiny_config(data=str(path)), 2)  # several chunks, written as they come
    assert prepared.train.table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert prepared.train.tokens == sum(len(ids) for ids in prepared.train.column("input_ids"))
    assert prepared.train.trained_tokens == sum(
        sum(label != IGNORE_INDEX for label in labels) for labels in prepared.train.column("labels")
    )
    # the fingerprint kept while the rows were written is the one of the table read back, in any chunking
    from leap_finetune.data.table import RowTable

    table = prepared.train.table
    for rechunked in (table.combine_chunks(), pa.concat_tables([table.slice(0, 7), table.slice(7)])):
        assert (
            RowTable(rechunked, prepared.train.tokens_per_row, prepared.train.trained_per_row).fingerprint()
            == prepared.train.fingerprint()
        )


# ---- the cache ----------------------------------------------------------------------------------------


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("LEAP_FINETUNE_CACHE", str(folder))
    return folder


def _validate(config) -> tuple:
    out = io.StringIO()
    prepared = validate_config(config, console=Console(file=out, width=200))
    return prepared, out.getvalue()


def test_the_cache_is_reused_invalidated_by_any_input_and_rebuilt_when_damaged(tmp_path, cache_dir):
    path = write_jsonl(tmp_path / "train.jsonl", [chat(f"question {i}", f"answer {i}") for i in range(40)])
    config = tiny_config(data=str(path), dataset={"path": str(path), "test_size": 4})
    first, out = _validate(config)
    assert first.from_cache is None and "read from the cache" not in out
    entries = [p for p in cache_dir.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1 and (entries[0] / "manifest.json").exists()
    again, out = _validate(config)
    assert again.from_cache == str(entries[0]) and "prepared rows read from the cache" in out
    assert (
        again.train.fingerprint() == first.train.fingerprint() and again.eval.fingerprint() == first.eval.fingerprint()
    )
    assert again.train.examples == first.train.examples
    assert [c.messages for c in again.sample_messages] == [c.messages for c in first.sample_messages]

    # any input the rows depend on makes a new entry
    changed = {
        "max_length": tiny_config(
            data=str(path), dataset={"path": str(path), "test_size": 4}, training_config={"max_length": 24}
        ),
        "loss_on": tiny_config(
            data=str(path), dataset={"path": str(path), "test_size": 4}, training_config={"loss_on": "all"}
        ),
        "test_size": tiny_config(data=str(path), dataset={"path": str(path), "test_size": 5}),
        "template": {
            **tiny_config(data=str(path), dataset={"path": str(path), "test_size": 4}),
            "chat_template": "lfm2.5",
        },
    }
    for what, other in changed.items():
        prepared, _ = _validate(other)
        assert prepared.from_cache is None, what
    # the data file's bytes (same size, same modification time: content is what counts)
    stat = path.stat()
    text = path.read_text()
    path.write_text(text.replace("answer 3", "answer X"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    edited, _ = _validate(config)
    assert edited.from_cache is None and edited.train.fingerprint() != first.train.fingerprint()
    path.write_text(text)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    # a damaged entry is detected, deleted and rebuilt
    arrow = entries[0] / "train.arrow"
    arrow.write_bytes(arrow.read_bytes()[:-20])
    rebuilt, out = _validate(config)
    assert rebuilt.from_cache is None and "incomplete or damaged" in out
    assert rebuilt.train.fingerprint() == first.train.fingerprint()
    assert _validate(config)[0].from_cache is not None
    # a half-written entry (no manifest: the writer died) is not used
    (entries[0] / "manifest.json").unlink()
    partial, out = _validate(config)
    assert partial.from_cache is None and "incomplete or damaged" in out


@pytest.mark.parametrize("training_type", ["dpo", "kto"])
def test_preference_data_is_cached_too(tmp_path, cache_dir, training_type):
    rows = []
    for i in range(12):
        prompt = [{"role": "user", "content": f"question {i}"}]
        if training_type == "dpo":
            rows.append(
                {
                    "prompt": prompt,
                    "chosen": [{"role": "assistant", "content": f"good {i}"}],
                    "rejected": [{"role": "assistant", "content": f"bad {i}"}],
                }
            )
        else:
            rows.append(
                {"prompt": prompt, "completion": [{"role": "assistant", "content": f"answer {i}"}], "label": i % 2 == 0}
            )
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    config = tiny_config(
        training_type=training_type,
        data=str(path),
        training_config={"extends": f"DEFAULT_{training_type.upper()}", "per_device_train_batch_size": 4},
    )
    first, _ = _validate(config)
    again, out = _validate(config)
    assert first.from_cache is None and again.from_cache is not None
    assert again.train.fingerprint() == first.train.fingerprint()
    assert again.train.column("prompt_ids") == first.train.column("prompt_ids")


def test_run_after_validate_reads_the_cache_and_says_so(tmp_path, cache_dir):
    from leap_finetune.api import run_config

    path = write_jsonl(tmp_path / "train.jsonl", [chat(f"q{i}", f"a{i}") for i in range(16)])
    config_path = write_config(tmp_path, tiny_config(data=str(path), training_config={"max_steps": 2}))
    _validate(config_path)
    out = io.StringIO()
    summary = run_config(config_path, console=Console(file=out, width=200), outputs_root=tmp_path / "outputs")
    assert "prepared rows read from the cache" in out.getvalue()
    assert summary["global_step"] == 2


# ---- Hub datasets: `limit` while reading -------------------------------------------------------------


def test_a_hub_dataset_with_limit_is_streamed_not_loaded_whole(tmp_path, monkeypatch):
    """A local folder in the Hub layout stands in for a Hub id (the same `datasets.load_dataset` call): with
    `limit` no Arrow copy of the split is written to the datasets cache; without, the whole split is."""
    from leap_finetune.data.readers import _read_hub

    cache = tmp_path / "hf-datasets"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    repo = tmp_path / "hub-dataset"
    (repo / "data").mkdir(parents=True)
    write_jsonl(repo / "data" / "train-00000-of-00001.jsonl", [chat(f"q{i}", f"a{i}") for i in range(300)])

    rows = _read_hub(str(repo), split="train", subset=None, limit=25)
    assert len(rows) == 25 and rows[0]["messages"][0]["content"] == "q0"
    assert not list(cache.rglob("*.arrow"))
    whole = _read_hub(str(repo), split="train", subset=None, limit=None)
    assert len(whole) == 300 and list(cache.rglob("*.arrow"))


# ---- several sources ---------------------------------------------------------------------------------


def _sources(tmp_path, sizes=(60, 20)) -> list:
    paths = []
    for index, size in enumerate(sizes):
        paths.append(
            str(
                write_jsonl(
                    tmp_path / f"source{index}.jsonl", [chat(f"s{index} q{i}", f"s{index} a{i}") for i in range(size)]
                )
            )
        )
    return paths


def test_several_sources_are_mixed_by_weight_or_epochs_and_reported(tmp_path):
    from leap_finetune.launch.reports.report import data_report

    first, second = _sources(tmp_path)
    config = tiny_config(data=first)
    config["dataset"] = [{"path": first, "weight": 1}, {"path": second, "weight": 3}]
    prepared, _ = _validate(config)
    texts = [ids for ids in prepared.train.column("input_ids")]
    assert len(texts) == 80  # the mix has the sources' rows in all, shared 1:3
    reports = {os.path.basename(s.path): s for s in prepared.sources}
    assert (reports["source0.jsonl"].used_rows, reports["source1.jsonl"].used_rows) == (20, 60)
    assert (reports["source0.jsonl"].rows_read, reports["source1.jsonl"].rows_read) == (60, 20)
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    decoded = [tokenizer.decode(ids) for ids in texts]
    assert sum("s1 q" in t for t in decoded) == 60 and len({t for t in decoded if "s1 q" in t}) == 20  # each 3 times
    assert len({t for t in decoded if "s0 q" in t}) == 20  # 20 different rows of 60

    config["dataset"] = [{"path": first, "epochs": 0.5, "test_size": 10}, {"path": second, "epochs": 2}]
    prepared, _ = _validate(config)
    assert len(prepared.train) == 25 + 40 and len(prepared.eval) == 10
    out = io.StringIO()
    data_report(Console(file=out, width=200), prepared, load_config(config))
    table = out.getvalue()
    assert "data sources" in table and "epochs 0.5" in table and "epochs 2" in table
    assert "source0.jsonl" in table and "source1.jsonl" in table and "used tokens" in table


def test_errors_name_the_source_and_entry(tmp_path):
    first, second = _sources(tmp_path, (5, 5))
    with open(second, "a") as handle:
        handle.write(json.dumps({"messages": [{"role": "user", "content": "no answer"}]}) + "\n")
    config = tiny_config(data=first)
    config["dataset"] = [{"path": first}, {"path": second}]
    with pytest.raises(DataError) as info:
        _validate(config)
    assert info.value.problems[0].file == second and info.value.problems[0].location == "line 6"
    for entry, message in (
        ([{"path": first, "weight": 1}, {"path": second}], "some sources have a weight and some do not (dataset[1])"),
        ([{"path": first}, {"path": second, "weight": -1}], "dataset[1].weight is -1: expected a number > 0"),
        ([{"path": first}, {"path": second, "epochs": 2, "weight": 1}], "either weight"),
        ([{"path": first}, {"path": second, "limt": 2}], "unknown key 'limt' in dataset[1]"),
        ([], "'dataset:' is an empty list"),
        ([{"path": first}, 5], "dataset[1] must be a path or a mapping with a path"),
    ):
        config["dataset"] = entry
        with pytest.raises(
            LeapError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
        ):
            load_config(config)
    config["dataset"] = {"path": first, "weight": 2}
    with pytest.raises(LeapError, match="share of several sources"):
        load_config(config)
    config["dataset"] = [{"path": first, "epochs": 0.01}, {"path": second, "limit": 5}]  # 5 rows x 0.01: none trained
    with pytest.raises(LeapError, match=r"epochs 0.01 takes 0 of this source's 5 training rows"):
        _validate(config)


def test_mixing_numbers_are_finite_and_a_source_is_listed_once(tmp_path):
    """`weight: .inf` was a traceback (NaN shares) in validate and run; a source listed twice trained every row twice
    without a word (and the rows one entry held out were trained by the other)."""
    from tests.conftest import invoke

    first, second = _sources(tmp_path, (6, 6))
    config = tiny_config(data=first)
    for entry, message, fix in (
        ({"weight": float("inf")}, "dataset[1].weight is .inf: expected a finite number > 0", "weight: 2 trains twice"),
        ({"weight": 0}, "dataset[1].weight is 0: expected a number > 0", "to leave the source out, remove it"),
        ({"weight": True}, "dataset[1].weight is true", "finite number > 0"),
        ({"epochs": float("inf")}, "dataset[1].epochs is .inf: expected a finite number > 0", "2 repeats each row"),
        ({"test_size": float("inf")}, "dataset[1].test_size is .inf: expected a finite number > 0", None),
    ):
        weights = {"weight": 1} if "weight" in entry else {}
        config["dataset"] = [{"path": first, **weights}, {"path": second, **entry}]
        with pytest.raises(LeapError) as info:
            load_config(config)
        assert message in info.value.message and f"(source: {second})" in info.value.message, info.value.format()
        assert fix is None or fix in info.value.fix
    config["dataset"] = [{"path": first, "weight": "1e308"}, {"path": second, "weight": 1e308}]  # (inf in all)
    prepared, _ = _validate(config)
    assert [source.used_rows for source in prepared.sources] == [6, 6]
    (tmp_path / "inf.yaml").write_text(
        f"model_name: tiny-lfm2\ndataset:\n  - {{path: {first}, weight: .inf}}\n  - {{path: {second}, weight: 1}}\n"
    )
    for command in ("validate", "run"):
        result = invoke(command, str(tmp_path / "inf.yaml"), cwd=tmp_path)
        assert result.returncode == 2 and "dataset[0].weight is .inf" in result.stderr, result.stderr

    folder = tmp_path / "sources"
    folder.mkdir()
    inside = str(write_jsonl(folder / "more.jsonl", [chat("q", "a")]))
    hub = {"path": "org/chats", "subset": "en"}
    for sources, overlap, held_out in (
        ([{"path": first, "test_size": 2}, {"path": "./" + os.path.relpath(first), "limit": 3}], first, True),
        ([{"path": inside}, {"path": str(folder)}], f"{inside} is in the folder {folder}", False),
        (
            [{**hub, "split": "train"}, {**hub, "split": "train[:10%]"}],
            "org/chats, subset en, split train[:10%]",
            False,
        ),
    ):
        config["dataset"] = sources
        with pytest.raises(LeapError) as info:
            load_config(config)
        assert (
            f"dataset[1] reads the rows of dataset[0] ({overlap}): they would be trained twice per epoch"
            in info.value.message
            and ("holds out for evaluation" in info.value.message) == held_out
        )
        assert "weight: 2" in info.value.fix and "epochs: 2" in info.value.fix
    (folder / "sub").mkdir()
    nested = str(write_jsonl(folder / "sub" / "nested.jsonl", [chat("q", "a")]))
    for sources in (
        [{**hub, "split": "train"}, {**hub, "split": "test"}],
        [{"path": str(folder)}, {"path": str(folder / "sub")}],  # a folder source reads no sub-folder
        [{"path": str(folder)}, {"path": nested}],
        [{**hub, "split": "train[:50%]"}, {**hub, "split": "train[50%:]"}],
        [hub, {"path": "org/chats", "subset": "fr"}],
        [{"path": first}, {"path": second}],
    ):
        config["dataset"] = sources
        load_config(config)  # other rows: accepted


def test_inspect_shows_the_first_training_rows_in_full(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [chat(f"question {i}", f"answer {i}") for i in range(30)])
    items = inspect_config(tiny_config(data=str(path)), rows=12)
    assert [item["row"] for item in items] == list(range(12))
    assert "question 11" in items[11]["text"] and items[11]["source"]["location"] == "line 12"
    span = items[0]["trained_spans"][0]
    assert items[0]["text"][span[0] : span[1]] == "answer 0<|im_end|>"


def test_progress_is_a_line_in_logs(monkeypatch):
    from leap_finetune.data.progress import Progress

    out = io.StringIO()
    progress = Progress(Console(file=out, width=200), processes=2)
    progress.start("tokenizing", 1000)
    progress.started -= 40  # as if it had run for 40 s
    progress.last_line -= 40
    progress.advance(400)
    line = out.getvalue()
    assert "data: tokenizing: 400/1,000 rows" in line and "rows/s" in line and "s left" in line


@pytest.mark.parametrize(
    "data, model, loss_on",
    [
        ("quickstart.jsonl", "tiny-lfm2", "assistant"),
        ("tool_calls.jsonl", "tiny-lfm2", "assistant"),
        ("tool_calls.jsonl", "tiny-lfm2.5", "final_assistant"),
        ("colors_sft.jsonl", "tiny-lfm2.5", "all"),
    ],
)
def test_the_shipped_data_prepares_to_the_per_row_renderers_rows(data, model, loss_on):
    """The whole data step (chunks, processes, Arrow) against the per-row path it replaces, row by row, on the
    example data (tool calls in both LFM formats, OpenAI-style calls converted)."""
    from leap_finetune.data.readers import read_dataset
    from leap_finetune.data.sft_rows import check_sft_row
    from leap_finetune.launch.checks import prepare
    from tests.conftest import EXAMPLES

    path = str(EXAMPLES / "data" / data)
    config = tiny_config(
        data=path,
        model_name=model,
        dataset={"path": path, "num_proc": 2, "cache": False},
        training_config={"max_length": 1024, "loss_on": loss_on},
    )
    resolved = load_config(config)
    _, renderer, prepared = prepare(resolved)
    family = "lfm2.5" if model == "tiny-lfm2.5" else "lfm2"
    expected = []
    for row in read_dataset(path).rows:
        conversation = check_sft_row(row, needs_assistant=loss_on != "all", family=family)[0]
        expected.append(renderer.tokenize(conversation.messages, conversation.tools))
    assert prepared.train.column("input_ids") == [r.input_ids for r in expected]
    assert prepared.train.column("labels") == [r.labels for r in expected]
    assert prepared.train.tokens == sum(r.tokens for r in expected)
    assert prepared.train.trained_tokens == sum(r.trained_tokens for r in expected) > 0


def test_progress_is_a_bar_with_rows_per_second_on_a_terminal():
    from leap_finetune.data.progress import Progress

    out = io.StringIO()
    progress = Progress(Console(file=out, width=200, force_terminal=True), processes=2)
    with progress:
        progress.start("tokenizing", 1000)
        progress.started -= 5
        progress.advance(500)
        assert progress.bar is not None
        progress.bar.refresh()
    assert "tokenizing" in out.getvalue() and "500/1000" in out.getvalue() and "rows/s" in out.getvalue()


def test_a_warning_on_every_row_is_counted_not_kept_row_by_row(tmp_path):
    from leap_finetune.launch.reports.report import data_report

    rows = [
        {
            "messages": [
                {"role": "user", "content": f"q{i}"},
                {"role": "assistant", "content": f"a{i}"},
                {"role": "system", "content": "late"},
                {"role": "user", "content": "again"},
                {"role": "system", "content": "later"},
                {"role": "assistant", "content": "b"},
            ]
        }
        for i in range(1200)
    ]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    config = tiny_config(data=str(path), dataset={"path": str(path), "num_proc": 2})
    for attempt in range(2):  # prepared, then read from the cache
        prepared, _ = _validate(config)
        assert (prepared.from_cache is not None) == bool(attempt)
        assert prepared.warning_rows == {"system_not_first": 1200} and len(prepared.warnings) == 20
        out = io.StringIO()
        data_report(Console(file=out, width=300), prepared, load_config(config))
        text = " ".join(out.getvalue().split())
        assert "system_not_first" in text and "1200 row(s), e.g." in text
        assert "line 1 (messages[2]), line 1 (messages[4]), line 2 (messages[2])" in text


def test_a_grpo_column_of_two_kinds_is_an_error_or_its_rows_are_skipped(tmp_path):
    """GRPO passes extra columns to the reward functions through Arrow: one kind per column. The check runs
    across every chunk (several processes), and `on_invalid: skip` drops exactly the rows that break it."""
    rows = [{"prompt": f"What is {i} + 1?", "solution": str(i + 1), "level": i % 3} for i in range(1500)]
    for i in (700, 1400):
        rows[i]["level"] = "hard"
    rows[1000]["level"] = 2.5  # a number too (a float among ints, in another chunk): one Arrow column of doubles
    path = write_jsonl(tmp_path / "grpo.jsonl", rows)
    config = tiny_config(
        training_type="grpo", data=str(path), dataset={"path": str(path), "num_proc": 2, "cache": False}
    )
    config["training_config"] = {"extends": "DEFAULT_GRPO", "max_steps": 1, "use_vllm": False}
    config["rewards"] = ["accuracy"]
    with pytest.raises(DataError) as info:
        _validate(config)
    assert [(p.location, p.field) for p in info.value.problems] == [("line 701", "level"), ("line 1401", "level")]
    assert "is a string, but a number in line 1" in info.value.problems[0].problem
    config["dataset"]["on_invalid"] = "skip"
    prepared, _ = _validate(config)
    assert len(prepared.train) == 1498 and prepared.invalid_skipped == 2
    assert set(prepared.train.column("level")) == {0, 1, 2, 2.5}


def _die(_):
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_data_worker_that_dies_is_an_error_not_a_wait_forever():
    from leap_finetune.data.chunks import Job, Workers

    with Workers(Job(resolved=None, renderer=None), 2) as workers:
        with pytest.raises(LeapError, match="a data worker process died"):
            list(workers.map(_die, range(4)))
