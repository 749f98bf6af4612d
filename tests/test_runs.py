"""runs/: a folder written whole or not at all, and the run folder's names (real files, a real SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from leap_finetune.runs import atomic
from leap_finetune.runs.atomic import replace_folder
from leap_finetune.runs.folder import RunFolder


def _fill(text: str):
    def write(folder: Path) -> None:
        folder.mkdir()
        (folder / "weights").write_text(text)

    return write


@pytest.mark.parametrize("swap", ["renameat2", "move aside"])
def test_a_folder_is_replaced_whole(tmp_path, monkeypatch, swap):
    if swap == "move aside":
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    target = tmp_path / "model"
    replace_folder(target, _fill("first"))
    assert (target / "weights").read_text() == "first"
    replace_folder(target, _fill("second"))
    assert (target / "weights").read_text() == "second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging, no old copy left


def test_the_swap_is_one_step_where_linux_has_renameat2(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _fill("A")(a)
    _fill("B")(b)
    assert atomic._exchange(a, b)  # (Linux 3.15+, glibc 2.28+: the machines this is tested on)
    assert (a / "weights").read_text() == "B" and (b / "weights").read_text() == "A"


def test_a_failed_write_leaves_the_old_folder_and_no_staging(tmp_path):
    target = tmp_path / "model"
    replace_folder(target, _fill("good"))

    def broken(folder: Path) -> None:
        folder.mkdir()
        (folder / "weights").write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        replace_folder(target, broken)
    assert (target / "weights").read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_process_killed_before_the_swap_leaves_the_old_folder(tmp_path):
    """SIGKILL between the write and the swap: the target is the old one; the next write clears the leftover."""
    target = tmp_path / "model"
    replace_folder(target, _fill("good"))
    code = (
        "import os, signal, sys; from pathlib import Path; from leap_finetune.runs.atomic import replace_folder\n"
        "def w(p): p.mkdir(); (p / 'weights').write_text('new')\n"
        "replace_folder(Path(sys.argv[1]), w, before_swap=lambda: os.kill(os.getpid(), signal.SIGKILL))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert (target / "weights").read_text() == "good"
    replace_folder(target, _fill("next"))
    assert (target / "weights").read_text() == "next"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_the_run_folder_names_each_entry_once(tmp_path):
    run = RunFolder(tmp_path)
    assert run.metrics == tmp_path / "metrics.jsonl" and run.summary == tmp_path / "summary.json"
    assert run.checkpoint(12) == tmp_path / "checkpoint-12"
    assert not run.is_run()
    run.resolved_config.write_text("x: 1")
    assert run.is_run()
    assert os.fspath(RunFolder(str(tmp_path)).path) == os.fspath(tmp_path)


def test_a_writer_that_writes_nothing_and_a_swap_that_cannot_happen_are_errors(tmp_path):
    target = tmp_path / "model"
    replace_folder(target, _fill("good"))
    with pytest.raises(FileNotFoundError, match="left no folder"):
        replace_folder(target, lambda folder: None)
    with pytest.raises(FileNotFoundError):  # (ENOENT from renameat2 is raised, not taken for "cannot swap")
        atomic._exchange(tmp_path / "missing", target)
    assert (target / "weights").read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_kill_between_the_two_renames_of_the_move_aside_swap_is_recovered(tmp_path):
    """Where the filesystem cannot swap: killed after the old folder was moved aside, before the new one moved in.
    The next write (or read through replace_folder) puts the old one back first."""
    target = tmp_path / "model"
    replace_folder(target, _fill("good"))
    target.rename(tmp_path / ".model.old-12345")  # (the state such a kill leaves)
    atomic.recover(target)
    assert (target / "weights").read_text() == "good"
    target.rename(tmp_path / ".model.old-12345")
    replace_folder(target, _fill("next"))
    assert (target / "weights").read_text() == "next"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
