"""Evaluation rows never trained on in silence: a local folder in the Hub's layout is read by split (train for
training, validation or test held out), `split` where there is none is refused, val_path equal to path is refused,
and every evaluation row that is also a training row - however it got there - is counted in the data report."""

from __future__ import annotations

import pytest

from leap_finetune.data.splits import folder_splits, split_of
from leap_finetune.errors import LeapError
from leap_finetune.launch.checks import prepare
from leap_finetune.validate.loader import load_config
from tests.conftest import chat, invoke, tiny_config, write_config, write_jsonl


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("train", "train"),
        ("train-00000-of-00002", "train"),
        ("my_training_set", "train"),
        ("test", "test"),
        ("data_eval", "test"),
        ("validation", "validation"),
        ("dev.v2", "validation"),
        ("val", "validation"),
        ("trained_rows", None),
        ("values", None),
        ("device_logs", None),
        ("interval", None),
        ("rows", None),
    ],
)
def test_split_names_are_read_as_datasets_reads_them(name, split):
    assert split_of(name) == split


def _rows(prefix: str, n: int) -> list[dict]:
    return [chat(f"{prefix} question {i}", f"{prefix} answer {i}") for i in range(n)]


def test_a_hub_layout_folder_trains_on_train_and_holds_out_test(workdir):
    folder = workdir / "d"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", _rows("train", 12))
    write_jsonl(folder / "test.jsonl", _rows("test", 4))
    (folder / "notes.txt").write_text("not data")  # (not read, and said)
    config = tiny_config(dataset={"path": "d", "split": "train"})
    _, _, prepared = prepare(load_config(write_config(workdir, config)))
    assert (len(prepared.train), len(prepared.eval)) == (12, 4)  # (was: 16 training rows, the test rows among them)
    text = invoke("validate", str(write_config(workdir, config)), cwd=workdir).stderr
    said = " ".join(text.split())
    assert "files named by split, read as datasets reads a folder: train (train.jsonl) for training" in said
    assert "test (test.jsonl) held out for evaluation" in said
    # test_size says where the evaluation rows come from instead: the test split is then not read, and said
    sized = tiny_config(dataset={"path": "d", "test_size": 2})
    _, _, prepared = prepare(load_config(write_config(workdir, sized)))
    assert (len(prepared.train), len(prepared.eval)) == (10, 2)
    said = " ".join(invoke("validate", str(write_config(workdir, sized)), cwd=workdir).stderr.split())
    assert "test (test.jsonl) not read: test_size holds out training rows instead" in said
    # `split: test` trains on the test files: the train files are not read, and the note says why (was: "None")
    tested = tiny_config(dataset={"path": "d", "split": "test"})
    said = " ".join(invoke("validate", str(write_config(workdir, tested)), cwd=workdir).stderr.split())
    assert "train (train.jsonl) not read: split: test names the training files, and no test or validation" in said
    assert "the evaluation split is None" not in said


def test_sub_folders_and_the_hubs_data_folder_are_splits_too(workdir):
    layout = workdir / "hub" / "data"
    layout.mkdir(parents=True)
    write_jsonl(layout / "train-00000-of-00001.jsonl", _rows("train", 6))
    write_jsonl(layout / "validation-00000-of-00001.jsonl", _rows("val", 2))
    write_jsonl(layout / "test-00000-of-00001.jsonl", _rows("test", 3))
    splits = folder_splits(workdir / "hub", (".jsonl",))
    assert sorted(splits) == ["test", "train", "validation"]
    _, _, prepared = prepare(load_config(write_config(workdir, tiny_config(dataset={"path": "hub"}))))
    assert (len(prepared.train), len(prepared.eval)) == (6, 2)  # (validation evaluates; test stays unread)
    nested = workdir / "nested"
    (nested / "train").mkdir(parents=True)
    (nested / "test").mkdir()
    write_jsonl(nested / "train" / "part-0.jsonl", _rows("train", 5))
    write_jsonl(nested / "test" / "part-0.jsonl", _rows("test", 2))
    _, _, prepared = prepare(load_config(write_config(workdir, tiny_config(dataset={"path": "nested"}))))
    assert (len(prepared.train), len(prepared.eval)) == (5, 2)


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [
        ({"path": "one.jsonl", "split": "test"}, "dataset.split is 'test', but"),
        ({"path": "one.jsonl", "val_path": "one.jsonl"}, "dataset.val_path is dataset.path"),
        ({"path": "d", "split": "validation"}, "no split 'validation'"),
    ],
)
def test_split_where_there_is_none_and_val_path_equal_to_path_are_refused(workdir, dataset, expected):
    write_jsonl(workdir / "one.jsonl", _rows("one", 8))
    (workdir / "d").mkdir()
    write_jsonl(workdir / "d" / "train.jsonl", _rows("train", 8))
    write_jsonl(workdir / "d" / "test.jsonl", _rows("test", 2))
    path = write_config(workdir, tiny_config(dataset=dataset))
    for command in ("validate", "run"):
        result = invoke(command, str(path), cwd=workdir)
        assert result.returncode == 2 and expected in " ".join(result.stderr.split()), result.stderr
    assert not (workdir / "outputs").exists()


@pytest.mark.parametrize("how", ["repeated_row", "val_path_overlaps", "mixture"])
def test_an_evaluation_row_that_is_also_a_training_row_is_counted(workdir, how):
    rows = _rows("row", 12)
    if how == "repeated_row":
        write_jsonl(workdir / "train.jsonl", rows + rows[:3])  # (three rows twice: the split may take either copy)
        dataset = {"path": "train.jsonl", "val_path": "held.jsonl"}
        write_jsonl(workdir / "held.jsonl", rows[:3] + _rows("held", 2))
        expected = "3 of the 5 evaluation row(s) are also training rows"
    elif how == "val_path_overlaps":
        write_jsonl(workdir / "train.jsonl", rows)
        write_jsonl(workdir / "held.jsonl", rows[5:7] + _rows("held", 2))
        dataset = {"path": "train.jsonl", "val_path": "held.jsonl"}
        expected = "2 of the 4 evaluation row(s) are also training rows"
    else:  # two sources: the second's held-out rows are the first's training rows
        write_jsonl(workdir / "a.jsonl", rows)
        write_jsonl(workdir / "b.jsonl", rows[:4] + _rows("b", 4))
        dataset = [{"path": "a.jsonl"}, {"path": "b.jsonl", "val_path": "b_held.jsonl"}]
        write_jsonl(workdir / "b_held.jsonl", rows[8:10])
        expected = "2 of the 2 evaluation row(s) are also training rows"
    result = invoke("validate", str(write_config(workdir, tiny_config(dataset=dataset))), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert expected in " ".join(result.stderr.split()), result.stderr
    # distinct rows: nothing said
    write_jsonl(workdir / "clean.jsonl", rows)
    clean = tiny_config(dataset={"path": "clean.jsonl", "test_size": 3})
    result = invoke("validate", str(write_config(workdir, clean, "clean.yaml")), cwd=workdir)
    assert "also training rows" not in result.stderr


def test_the_folder_split_error_names_the_splits(workdir):
    (workdir / "d").mkdir()
    write_jsonl(workdir / "d" / "train.jsonl", _rows("train", 4))
    with pytest.raises(LeapError) as info:
        prepare(load_config(write_config(workdir, tiny_config(dataset={"path": "d", "split": "test"}))))
    # (split: test on a folder with only train files: the folder is read by split, and test is not one of them)
    assert "no split 'test'" in info.value.format() and "train (1 file(s))" in info.value.format()


def test_an_ordinary_folder_is_read_whole_and_split_train_on_a_file_is_the_default(workdir):
    """Split names count only where every data file at the folder's top has one: `general.jsonl` beside
    `training_extra.jsonl`, or `data.jsonl` beside a `test/` folder of fixtures, is an ordinary folder."""
    mixed = workdir / "mixed"
    mixed.mkdir()
    write_jsonl(mixed / "general.jsonl", _rows("general", 6))
    write_jsonl(mixed / "training_extra.jsonl", _rows("extra", 2))
    _, _, prepared = prepare(load_config(write_config(workdir, tiny_config(dataset={"path": "mixed"}))))
    assert len(prepared.train) == 8 and len(prepared.eval) == 0
    fixtures = workdir / "fixtures"
    (fixtures / "test").mkdir(parents=True)
    write_jsonl(fixtures / "data.jsonl", _rows("data", 5))
    write_jsonl(fixtures / "test" / "case.jsonl", _rows("case", 2))
    _, _, prepared = prepare(load_config(write_config(workdir, tiny_config(dataset={"path": "fixtures"}))))
    assert len(prepared.train) == 5
    # a file named like a test split among unnamed ones is trained on with them - and said
    write_jsonl(mixed / "test.jsonl", _rows("test", 2))
    said = " ".join(
        invoke(
            "validate", str(write_config(workdir, tiny_config(dataset={"path": "mixed"}))), cwd=workdir
        ).stderr.split()
    )
    assert "test.jsonl named like an evaluation split, read as training rows" in said, said
    write_jsonl(workdir / "one.jsonl", _rows("one", 4))
    default = tiny_config(dataset={"path": "one.jsonl", "split": "train"})  # (as copied from a Hub config)
    assert invoke("validate", str(write_config(workdir, default)), cwd=workdir).returncode == 0
