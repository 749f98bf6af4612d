"""leap-finetune: config-driven fine-tuning for LFM2 / LFM2.5 and any Hugging Face causal LM."""

__version__ = "0.1.0"

from leap_finetune.errors import LeapError  # noqa: E402
from leap_finetune.quiet import quiet_bitsandbytes  # noqa: E402

quiet_bitsandbytes()  # (before peft imports it, in every process of a run: quiet.py)

# what the package offers, by the module that has it: imported when first used - the API imports torch and
# transformers; `import leap_finetune` (and `--help`) stays fast
EXPORTS = {
    "run_config": "api",
    "validate_config": "api",
    "plan_config": "api",
    "slurm_config": "api",
    "inspect_config": "api",
    "load_config": "api",
    "evaluate_config": "api",
    "export_model": "export",
}


def __getattr__(name: str):
    if name in EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"leap_finetune.{EXPORTS[name]}"), name)
    raise AttributeError(f"module 'leap_finetune' has no attribute {name!r}")


__all__ = ["LeapError", *EXPORTS, "__version__"]
