"""`dataset:` in the config: one source or a list of them, each checked on its own (errors name `dataset[i]`),
and their paths resolved against the config file's folder."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from leap_finetune.config.paths import local_path
from leap_finetune.config.schema import DatasetConfig
from leap_finetune.errors import LeapError


def validate_dataset(raw, where: str):
    """`dataset:` as one mapping or a list of them (several sources), each checked on its own so an error
    names the entry (`dataset[1].limit`)."""
    from leap_finetune.config.loader import _check_keys, _pydantic_error

    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise LeapError("'dataset:' is an empty list", where=where, fix="give at least one source: - path: data.jsonl")
    validated = []
    for index, item in enumerate(items):
        name = f"dataset[{index}]" if isinstance(raw, list) else "dataset"
        if not isinstance(item, dict):
            raise LeapError(f"{name} must be a mapping with a path (got {type(item).__name__})", where=where,
                            fix="write each source as `- path: data.jsonl` (with its own limit, weight, ...)")
        _check_keys(item, DatasetConfig.model_fields, where, name)
        try:
            validated.append(DatasetConfig.model_validate(item))
        except ValidationError as err:
            raise _pydantic_error(err, where, prefix=name) from None
    weighted = [item.weight is not None for item in validated]
    if isinstance(raw, dict) and validated[0].weight is not None:
        raise LeapError("dataset.weight is a share of several sources, and there is one", where=f"{where}: dataset.weight",
                        fix="remove it (or use epochs: N to repeat the rows; or list several sources)")
    if any(weighted) and not all(weighted):
        missing = ", ".join(f"dataset[{i}]" for i, w in enumerate(weighted) if not w)
        raise LeapError(f"some sources have a weight and some do not ({missing})", where=f"{where}: dataset",
                        fix="give every source a weight (their shares of the mix), or none (use epochs per source)")
    return validated if isinstance(raw, list) else validated[0]


def resolve_dataset(model, base: Path, where: str):
    if model.dataset is None:
        return None
    items = model.dataset if isinstance(model.dataset, list) else [model.dataset]
    resolved = []
    for index, item in enumerate(items):
        name = f"dataset[{index}]" if isinstance(model.dataset, list) else "dataset"
        dataset = item.model_copy()
        dataset_type = dataset.type or model.training_type
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
        resolved.append(dataset)
    return resolved if isinstance(model.dataset, list) else resolved[0]


DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def resolve_data_path(path: str, base: Path) -> str:
    """A local path (made absolute) or a Hub dataset id (kept as written)."""
    candidate = local_path(path, base)
    looks_local = (
        path.startswith((".", "/", "~")) or path.endswith(DATA_SUFFIXES) or path.count("/") != 1
    )
    if candidate.exists() or looks_local:
        return str(candidate)
    return path
