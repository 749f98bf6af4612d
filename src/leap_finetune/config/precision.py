"""`optimizer_precision`'s values and what each needs (the optimizers themselves: recipes/optimizers.py)."""

from __future__ import annotations

import importlib.util

from leap_finetune.config.suggest import check_choice
from leap_finetune.errors import LeapError

PRECISIONS = {
    "fp32": "float32 master weights and AdamW states (bf16 autocast)",
    "bf16_kahan": "bf16 weights and AdamW states with Kahan summation (torch-optimi)",
}
PACKAGE = {"bf16_kahan": ("optimi", "torch-optimi"), "fp8": ("torchao", "torchao")}  # -> (module, PyPI name)
# training_config.precision: the linear layers' matmuls (recipes/fp8.py)
MATMUL_PRECISIONS = {
    "bf16": "bf16 autocast (the default)",
    "fp8": "torchao float8 training, rowwise scales (GPUs of compute capability 8.9+)",
}
FP8_CAPABILITY = (8, 9)  # FP8 tensor-core matmuls: Ada (8.9) and Hopper (9.0) and later
# the Trainer's AdamW variants this replaces; other optimizers are not combined with it
COMPATIBLE_OPTIM = ("adamw_torch", "adamw_torch_fused", "adamw_hf")


def missing_package(precision: str) -> str | None:
    """The PyPI package `precision` needs and that is not installed, or None."""
    module, name = PACKAGE.get(precision, (None, None))
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return name


def init_dtype(training: dict):
    """model_init_kwargs' dtype as written (both spellings: config/model_init.py), or None."""
    init = training.get("model_init_kwargs") if isinstance(training.get("model_init_kwargs"), dict) else {}
    return init.get("dtype", init.get("torch_dtype"))


def keeps_bf16_weights(precision: str | None) -> bool:
    return bool(precision) and precision.startswith("bf16")


def check_optimizer_precision(user: dict, where: str, lora: bool) -> None:
    """`optimizer_precision` (recipes/optimizers.py): a known value, its package installed, and no key that
    contradicts it (weights in another dtype, fp16, another optimizer, LoRA)."""
    value = user["optimizer_precision"]
    check_choice("optimizer_precision", value, PRECISIONS, where)
    package = missing_package(value)
    if package:
        raise LeapError(
            f"training_config.optimizer_precision: {value} needs the {package} package, which is not installed",
            where=where,
            fix=f"pip install {package} (or `pip install 'leap-finetune[speed]'`), or use optimizer_precision: fp32",
        )
    dtype = init_dtype(user)
    if not keeps_bf16_weights(value):
        if dtype in ("bfloat16", "bf16", "torch.bfloat16", "float16", "fp16", "torch.float16"):
            raise LeapError(
                f"training_config.optimizer_precision is {value} (float32 master weights), but "
                f"model_init_kwargs.dtype is {dtype!r}",
                where=where,
                fix="remove one of them: optimizer_precision: bf16_kahan keeps bf16 weights with exact updates; "
                "model_init_kwargs.dtype alone trains plain bf16 weights",
            )
        return
    if dtype not in (None, "bfloat16", "bf16", "torch.bfloat16"):
        raise LeapError(
            f"training_config.optimizer_precision: {value} keeps the weights in bf16, but model_init_kwargs.dtype "
            f"is {dtype!r}",
            where=where,
            fix="remove model_init_kwargs.dtype (the weights are loaded in bf16), or use optimizer_precision: fp32",
        )
    if user.get("fp16"):
        raise LeapError(
            f"training_config.optimizer_precision: {value} trains bf16 weights, and fp16 is true",
            where=where,
            fix="remove fp16 (bf16 autocast is used where the GPU has it), or use optimizer_precision: fp32",
        )
    if lora:
        raise LeapError(
            f"training_config.optimizer_precision: {value} is for full fine-tuning: LoRA trains float32 adapters "
            "(PEFT keeps them in float32), so there are no bf16 weights for Kahan summation to correct",
            where=where,
            fix="remove optimizer_precision; to hold the frozen base in bf16 with LoRA, set "
            "training_config.model_init_kwargs: {dtype: bfloat16}",
        )
    optim = user.get("optim")
    if optim is not None and optim not in COMPATIBLE_OPTIM:
        raise LeapError(
            f"training_config.optimizer_precision: {value} is its own AdamW, and optim is {optim!r}",
            where=where,
            fix="remove optim (optimizer_precision chooses the optimizer), or use optimizer_precision: fp32",
        )


def check_matmul_precision(user: dict, where: str) -> None:
    """training_config.precision: fp8 needs bf16 autocast around it (not fp16). QLoRA's base, QAT, torchao installed
    and the GPU itself are checked with the resolved config and the device plan (launch/checks.py `check_fp8`), in that
    order: a conflict in the config is said before an install that would not help."""
    value = user["precision"]
    check_choice("precision", value, MATMUL_PRECISIONS, where)
    if value != "fp8":
        return
    if user.get("fp16") or user.get("bf16") is False:
        key = "fp16 is true" if user.get("fp16") else "bf16 is false"
        raise LeapError(
            f"training_config.precision: fp8 runs under bf16 autocast (its matmuls give bf16 outputs), and {key}",
            where=where,
            fix="remove fp16 / bf16 (bf16 is used on every GPU with FP8)",
        )


def require_torchao(where: str) -> None:
    """precision: fp8's library (after the config's own conflicts: launch/checks.py check_fp8)."""
    if missing_package("fp8"):
        raise LeapError(
            "training_config.precision: fp8 runs the linear layers through torchao's float8 training, and torchao "
            "is not installed",
            where=where,
            fix="pip install 'leap-finetune[fp8]' (torchao), or remove precision (bf16)",
        )


def fp8_device_problem(capabilities: list[str]) -> str | None:
    """Why the training GPUs (nvidia-smi's compute_cap of each) cannot run FP8 matmuls; None where they can."""
    for cap in capabilities:
        try:
            major, minor = (int(part) for part in cap.split("."))
        except ValueError:
            continue
        if (major, minor) < FP8_CAPABILITY:
            return f"a GPU of compute capability {cap} (FP8 matmuls need 8.9+: H100, H200, L4, RTX 4090)"
    return None
