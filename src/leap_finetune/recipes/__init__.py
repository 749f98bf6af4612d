"""One recipe per training type. Each module offers `config_class()`, `training_arguments(...)`
and `train(resolved_dict, callbacks)`."""

from __future__ import annotations

import importlib


def recipe(training_type: str):
    return importlib.import_module(f"leap_finetune.recipes.{training_type}")
