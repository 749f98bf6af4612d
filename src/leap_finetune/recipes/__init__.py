"""One recipe per training type: the module its Method names (`recipe_module`; recipes/<name>.py by default), found
by `recipe(training_type)`. Each implements `Recipe` (tests/test_methods.py checks every registered type's module
against it by signature)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Protocol

from leap_finetune.methods import method_of

if TYPE_CHECKING:
    from leap_finetune.config.resolved import ResolvedConfig


class Recipe(Protocol):
    """What the driver and the workers ask of a recipe module (launch/: the plan, the checks, the training process)."""

    def config_class(self) -> type:
        """The library's training-arguments class (TRL's SFTConfig, ...), as the type's Method names it."""

    def training_arguments(
        self, resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None
    ) -> dict:
        """The keyword arguments of `config_class()` for this run (`cuda`: the driver's plan, without touching
        CUDA; None: the training process asks torch)."""

    def train(self, resolved_json: dict, callbacks: list | None = None) -> dict:
        """Train, evaluate and save the run of a resolved config (its JSON form: Ray and a child process pass it
        as it is); the run's summary."""


def recipe(training_type: str, *, to_train: bool = False) -> Recipe:
    """`to_train`: a training process is about to train: the trainer class its Method names is imported too.
    Both with the collector paused (leap_finetune/startup.py: 3 s of a training process's start on 2 cores)."""
    from leap_finetune.startup import import_quickly

    method = method_of(training_type)
    module = import_quickly(method.recipe_module)
    if to_train and method.trainer:
        library, name = method.trainer.split(":")
        import_quickly(library)
        if name not in vars(sys.modules[library]):  # (TRL's lazy module imports the class's own module on access)
            from leap_finetune.startup import collector_paused

            with collector_paused():
                getattr(sys.modules[library], name)
    return module
