"""`optimizer_precision`'s values and what each needs (the optimizers themselves: recipes/optimizers.py)."""

from __future__ import annotations

import importlib.util

PRECISIONS = {
    "fp32": "float32 master weights and AdamW states (bf16 autocast)",
    "bf16_kahan": "bf16 weights and AdamW states with Kahan summation (torch-optimi)",
}
PACKAGE = {"bf16_kahan": ("optimi", "torch-optimi")}  # precision -> (module, PyPI name)
# the Trainer's AdamW variants this replaces; other optimizers are not combined with it
COMPATIBLE_OPTIM = ("adamw_torch", "adamw_torch_fused", "adamw_hf")


def missing_package(precision: str) -> str | None:
    """The PyPI package `precision` needs and that is not installed, or None."""
    module, name = PACKAGE.get(precision, (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return name


def keeps_bf16_weights(precision: str | None) -> bool:
    return bool(precision) and precision.startswith("bf16")
