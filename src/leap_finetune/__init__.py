"""leap-finetune: config-driven fine-tuning for LFM2 / LFM2.5 and any Hugging Face causal LM."""

__version__ = "0.1.0"

from leap_finetune.errors import LeapError  # noqa: E402


def __getattr__(name: str):
    # The API imports torch/transformers; keep `import leap_finetune` (and `--help`) fast.
    if name in {"run_config", "validate_config", "inspect_config", "load_config", "evaluate_config"}:
        from leap_finetune import api

        return getattr(api, name)
    raise AttributeError(name)


__all__ = ["LeapError", "run_config", "validate_config", "inspect_config", "load_config", "evaluate_config",
           "__version__"]
