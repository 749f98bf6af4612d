"""`dataset:` in the config: one source or a list of them, each checked on its own (errors name `dataset[i]`),
and their paths resolved against the config file's folder."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from leap_finetune.config.paths import local_path
from leap_finetune.config.schema_dataset import DatasetConfig
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of, same_rows


def validate_dataset(raw, where: str):
    """`dataset:` as one mapping or a list of them (several sources), each checked on its own so an error
    names the entry (`dataset[1].limit`)."""
    from leap_finetune.validate.keys import check_keys, pydantic_error

    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise LeapError("'dataset:' is an empty list", where=where, fix="give at least one source: - path: data.jsonl")
    validated = []
    for index, item in enumerate(items):
        name = f"dataset[{index}]" if isinstance(raw, list) else "dataset"
        if not isinstance(item, dict):
            raise LeapError(
                f"{name} must be a path or a mapping with a path (got {type(item).__name__})",
                where=where,
                fix="write each source as `- data.jsonl`, or `- path: data.jsonl` with its own limit, weight, ...",
            )
        check_keys(item, DatasetConfig.model_fields, where, name)
        try:
            validated.append(DatasetConfig.model_validate(item))
        except ValidationError as err:
            raise _source_error(pydantic_error(err, where, prefix=name), err, item) from None
    weighted = [item.weight is not None for item in validated]
    if isinstance(raw, dict) and validated[0].weight is not None:
        raise LeapError(
            "dataset.weight is a share of several sources, and there is one",
            where=f"{where}: dataset.weight",
            fix="remove it (or use epochs: N to repeat the rows; or list several sources)",
        )
    if any(weighted) and not all(weighted):
        missing = ", ".join(f"dataset[{i}]" for i, w in enumerate(weighted) if not w)
        raise LeapError(
            f"some sources have a weight and some do not ({missing})",
            where=f"{where}: dataset",
            fix="give every source a weight (their shares of the mix), or none (use epochs per source)",
        )
    return validated if isinstance(raw, list) else validated[0]


# Why a mixing key must be a finite number > 0, and what to write instead of 0 (which would train nothing of the source)
MIXING_FIXES = {
    "weight": "give it a finite number > 0: its share relative to the other sources' weights (weight: 2 trains twice "
    "the rows of weight: 1); to leave the source out, remove it from the list",
    "epochs": "give it a finite number > 0 (2 repeats each row twice, 0.5 takes half of them); to leave the source "
    "out, remove it from the list",
}


def _source_error(error: LeapError, err: ValidationError, item: dict) -> LeapError:
    """A source's key error, naming the source's path too (several sources may share a key's index-free name)."""
    key = next((str(part) for part in err.errors()[0]["loc"]), "")
    path = item.get("path")
    message = error.message + (f" (source: {path})" if isinstance(path, str) else "")
    return LeapError(message, where=error.where, fix=MIXING_FIXES.get(key, error.fix))


def resolve_dataset(model, base: Path, where: str):
    if model.dataset is None:
        return None
    items = model.dataset if isinstance(model.dataset, list) else [model.dataset]
    resolved = []
    for index, item in enumerate(items):
        name = f"dataset[{index}]" if isinstance(model.dataset, list) else "dataset"
        dataset = item.model_copy()
        dataset_type = dataset.type or model.training_type
        if same_rows(dataset_type, model.training_type):
            dataset_type = model.training_type  # (sft rows for distill: the same rows, read the same way)
        if dataset_type != model.training_type:
            raise LeapError(
                f"{name}.type is '{dataset_type}' but training_type is '{model.training_type}'",
                where=f"{where}: {name}.type",
                fix=f"set {name}.type: {model.training_type} (or remove it: it defaults to the training type)",
            )
        dataset.type = dataset_type
        dataset.path = resolve_data_path(dataset.path, base)
        if dataset.val_path:
            dataset.val_path = resolve_data_path(dataset.val_path, base)
        _check_split_and_val_path(dataset, name, where)
        _check_subset(dataset, name, where)
        if dataset.image_root:
            root = local_path(dataset.image_root, base)
            if not root.is_dir():
                raise LeapError(
                    f"dataset.image_root is not a folder: {root}",
                    where=f"{where}: dataset.image_root",
                    fix="give the folder that relative image paths in the rows start from (or leave it out: they "
                    "start from the data file's folder)",
                )
            dataset.image_root = str(root)
        resolved.append(dataset)
    if isinstance(model.dataset, list):
        check_distinct_sources(resolved, where)
    return resolved if isinstance(model.dataset, list) else resolved[0]


def _check_split_and_val_path(dataset, name: str, where: str) -> None:
    """`split` only where there are splits (a Hub dataset, a local folder whose files are named by split: a single
    file's every row is read whatever split says); a val_path that is the training data itself is refused (every
    evaluation row would be a training row)."""
    from leap_finetune.data.readers import SUFFIXES
    from leap_finetune.data.splits import folder_splits

    local = Path(dataset.path)
    explicit = "split" in dataset.model_fields_set and dataset.split != "train"  # (train: the default, read whole)
    if explicit and local.is_absolute() and local.exists():
        if local.is_file() or not folder_splits(local, SUFFIXES):
            what = "one file" if local.is_file() else "a folder whose files are not named by split"
            raise LeapError(
                f"{name}.split is '{dataset.split}', but {dataset.path} is {what}: every row of it is read, whatever "
                "split says",
                where=f"{where}: {name}.split",
                fix="remove split; hold out evaluation rows with test_size, or give the evaluation file as val_path "
                "(a folder with train.jsonl and test.jsonl is read by split, as datasets reads it)",
            )
    if dataset.val_path and dataset.val_path == dataset.path:
        raise LeapError(
            f"{name}.val_path is {name}.path ({dataset.path}): every evaluation row would also be a training row, "
            "and the eval loss would measure memorisation",
            where=f"{where}: {name}.val_path",
            fix="give a file of rows kept out of training as val_path, or hold rows out with test_size instead",
        )


def _check_subset(dataset, name: str, where: str) -> None:
    """`subset` chooses a configuration of a Hub dataset (datasets.load_dataset(name, subset)); a local file or folder
    has none, and the key was read past in silence."""
    if dataset.subset is None:
        return
    if not all(Path(p).is_absolute() for p in (dataset.path, dataset.val_path) if p):
        return  # (a Hub dataset among them: subset selects its configuration)
    what = "folder" if Path(dataset.path).is_dir() else "file"
    raise LeapError(
        f"{name}.subset is {dataset.subset!r}, but {dataset.path} is a local {what}: subset selects a configuration "
        f"of a Hugging Face Hub dataset and has no meaning for a local {what}",
        where=f"{where}: {name}.subset",
        fix=f"remove {name}.subset (to train on part of the rows, use {name}.limit; to read a Hub dataset's "
        "configuration, give its id as path)",
    )


def check_distinct_sources(items: list, where: str) -> None:
    """The same rows listed twice would be trained twice per epoch, and rows one entry holds out for evaluation
    would be trained by the other: refused, since `weight` or `epochs` says "more of this source" outright."""
    for later, item in enumerate(items):
        for earlier in range(later):
            overlap = _same_rows(items[earlier], item)
            if overlap is None:
                continue
            held_out = any(source.test_size for source in (items[earlier], item))
            raise LeapError(
                f"dataset[{later}] reads the rows of dataset[{earlier}] ({overlap}): they would be trained twice per "
                "epoch"
                + (
                    ", and the rows one entry holds out for evaluation would be trained by the other"
                    if held_out
                    else ""
                ),
                where=where,
                fix="list the source once; to train its rows more often, give it weight: 2 (twice the share of a "
                "source with weight: 1) or epochs: 2",
            )


def _same_rows(a, b) -> str | None:
    """Why two sources read the same rows (None when they do not): the same file, a file of a folder source, or
    the same Hub split (limits aside: both start at the first row)."""
    local_a, local_b = Path(a.path), Path(b.path)
    if local_a.is_absolute() and local_b.is_absolute():
        if local_a == local_b:
            return a.path
        for folder, file in ((local_a, local_b), (local_b, local_a)):
            if (
                folder.is_dir() and file.is_file() and file.parent == folder
            ):  # (a folder source reads the files in it, not sub-folders)
                return f"{file} is in the folder {folder}"
        return None
    if a.path == b.path and a.subset == b.subset and _split_overlaps(a.split, b.split):
        return f"{a.path}" + (f", subset {a.subset}" if a.subset else "") + f", split {b.split}"
    return None


def _split_overlaps(a: str, b: str) -> bool:
    """`train` and `train[:10%]` overlap; two different slices of a split are taken as chosen apart."""
    name_a, _, slice_a = a.partition("[")
    name_b, _, slice_b = b.partition("[")
    return name_a == name_b and (not slice_a or not slice_b or slice_a == slice_b)


DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def resolve_data_path(path: str, base: Path) -> str:
    """A local path (made absolute) or a Hub dataset id (kept as written)."""
    candidate = local_path(path, base)
    looks_local = path.startswith((".", "/", "~")) or path.endswith(DATA_SUFFIXES) or path.count("/") != 1
    if candidate.exists() or looks_local:
        return str(candidate)
    return path


def check_hold_out_tools(model, dataset, evals, vision: bool, where: str) -> None:
    """`dataset.hold_out_tools` on data that has tool calls (sft conversations, grpo prompts with a solution), on a
    text model, and with no benchmark of its own named like the one it makes. Whether each named tool occurs in the
    rows is checked when the rows are read (data/held_out_tools.py)."""
    from leap_finetune.data.held_out_tools import UNSEEN_TOOLS_BENCHMARK
    from leap_finetune.data.row_kinds import row_kind_of

    items = dataset if isinstance(dataset, list) else [dataset]
    named = [(i, item) for i, item in enumerate(items) if item is not None and item.hold_out_tools]
    if not named:
        return
    index, item = named[0]
    key = f"dataset[{index}].hold_out_tools" if isinstance(dataset, list) else "dataset.hold_out_tools"
    if not row_kind_of(model.training_type).tool_calls:
        raise LeapError(
            f"this key holds out tool-calling rows of sft or grpo data; training_type is {model.training_type}",
            where=f"{where}: {key}",
            fix=f"remove {key} (or hold the rows out of the {model.training_type} data yourself)",
        )
    if vision:
        raise LeapError(
            f"{key} is for text models: the held-out rows become a text benchmark, and '{model.model_name}' is a "
            "vision-language model",
            where=f"{where}: {key}",
            fix=f"remove {key}, and write the unseen-tools benchmark rows yourself (docs/tool-calling.md)",
        )
    for number, bench in enumerate(evals.benchmarks if evals is not None else []):
        if bench.name == UNSEEN_TOOLS_BENCHMARK:
            raise LeapError(
                f"benchmark '{UNSEEN_TOOLS_BENCHMARK}' is the name of the benchmark {key} makes from the held-out rows",
                where=f"{where}: evals.benchmarks[{number}].name",
                fix=f"rename your benchmark (or remove {key})",
            )


def check_augment_tools(model, dataset, where: str) -> None:
    """`dataset.augment_tools` rewrites SFT conversations; GRPO's episodes have their own key, and the other
    training types' rows are not rewritten (it would do nothing there). Whether any row has definitions to disguise
    is checked when the rows are read (data/prepare.py)."""
    from leap_finetune.data.row_kinds import row_kind_of

    items = dataset if isinstance(dataset, list) else [dataset]
    for index, item in enumerate(items):
        if item is None or item.augment_tools is False or row_kind_of(model.training_type).disguises_tools:
            continue
        key = f"dataset[{index}].augment_tools" if isinstance(dataset, list) else "dataset.augment_tools"
        fix = (
            "set environment.augment_tools: true (each training episode is shown disguised tools)"
            if method_of(model).rewards
            else f"remove {key}"
        )
        raise LeapError(
            f"this key disguises the tools of sft conversations; training_type is {model.training_type}, whose rows "
            "it would not change",
            where=f"{where}: {key}",
            fix=fix,
        )
