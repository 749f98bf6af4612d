"""A local folder in the Hugging Face Hub's layout: files (or sub-folders) named by split - `train.jsonl`,
`test.jsonl`, `data/train-00000-of-00001.parquet`, `validation/part-0.jsonl` - read as `datasets` reads them, one
split at a time. Reading every file of such a folder as training rows would train on its test rows.

The names are `datasets`' own (its data_files patterns): a split's keyword at the start of the name or after a
separator (- _ . space or a digit), followed by a separator or the end; `dev`, `val` and `valid` mean validation,
`eval`, `evaluation` and `testing` mean test, `training` means train.
"""

from __future__ import annotations

import re
from pathlib import Path

KEYWORDS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test", "testing", "eval", "evaluation"),
}
EVAL_SPLITS = ("validation", "test")  # the one held out for evaluation: validation where both exist
_SEP = r"[-._ 0-9]"


def split_of(name: str) -> str | None:
    """The split a file or folder name means, or None."""
    stem = name.lower()
    for split, words in KEYWORDS.items():
        for word in words:
            if re.search(rf"(^|{_SEP}){word}({_SEP}|$)", stem):
                return split
    return None


def folder_splits(folder: Path, suffixes: tuple[str, ...]) -> dict[str, list[Path]]:
    """The data files of each split of `folder` ({} when no file or sub-folder is named by split): top-level files,
    sub-folders named by split (their files), and a `data/` sub-folder in the same layout (the Hub's own)."""
    return read_layout(folder, suffixes)[0]


def read_layout(folder: Path, suffixes: tuple[str, ...]) -> tuple[dict[str, list[Path]], list[str]]:
    """(folder_splits, the entries of the folder that no split reads, as names: `notes.txt`, `old/`). A folder is in
    the split layout only when every data file at its top is named by a split (`general.jsonl` beside
    `training_extra.jsonl`, or `data.jsonl` beside a `test/` folder of fixtures, is an ordinary folder)."""
    if (folder / "data").is_dir() and not any(_data_files(folder, suffixes)):
        folder = folder / "data"
    splits: dict[str, list[Path]] = {}
    unread = []
    unnamed = [p for p in _data_files(folder, suffixes) if split_of(p.stem) is None]
    if unnamed:  # (a data file named by no split: an ordinary folder of files, every one of them read)
        return {}, []
    for entry in sorted(p for p in folder.iterdir() if not p.name.startswith(".")):
        split = split_of(entry.stem if entry.is_file() else entry.name)
        files = [entry] if entry.is_file() and entry.suffix.lower() in suffixes else list(_data_files(entry, suffixes))
        if split is None or not files:
            unread.append(entry.name + ("/" if entry.is_dir() else ""))
            continue
        splits.setdefault(split, []).extend(files)
    return splits, unread


def _data_files(folder: Path, suffixes: tuple[str, ...]):
    if not folder.is_dir():
        return
    yield from (
        p
        for p in sorted(folder.iterdir())
        if p.is_file() and p.suffix.lower() in suffixes and not p.name.startswith(".")
    )


def eval_split(splits: dict[str, list[Path]]) -> str | None:
    return next((s for s in EVAL_SPLITS if s in splits), None)


def eval_named(folder: Path, suffixes: tuple[str, ...]) -> str:
    """An ordinary folder (not every file named by split) whose files include one named like a test or validation
    split: what the data report says (those rows are trained on with the rest), or ''."""
    named = [p.name for p in _data_files(folder, suffixes) if split_of(p.stem) in EVAL_SPLITS]
    if not named:
        return ""
    return (
        f"{folder}: {', '.join(named)} named like an evaluation split, read as training rows with the folder's other "
        "files (not every file there is named by a split); to hold it out, give it as val_path, or name every file "
        "by its split (train.jsonl, test.jsonl) to read the folder by split"
    )
