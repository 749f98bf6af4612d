"""`adapter_path`: continue training a LoRA adapter (leap-finetune's `adapter/`, peft's or Unsloth's save). Its shape
- rank, alpha, target modules, DoRA, rsLoRA, dropout - is the adapter's own (`adapter_config.json`): the run trains
that adapter further, so `peft_config` may add what does not change it (QLoRA's quantization of the base) and a value
of its that differs is an error naming both. The recipes load it onto the base (recipes/common.py with_adapter)."""

from __future__ import annotations

import json
from pathlib import Path

from leap_finetune.config.paths import local_path
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of

# adapter_config.json keys that are the adapter's shape (a peft_config value of them must agree)
SHAPE_KEYS = ("r", "lora_alpha", "target_modules", "use_dora", "use_rslora", "lora_dropout", "bias", "modules_to_save")


def adapter_folder(value: str, base: Path, where: str) -> Path:
    """The folder holding adapter_config.json: the path itself, or a LoRA run's adapter/ (a project folder: its
    newest finished run's)."""
    from leap_finetune.runs.folder import RunFolder

    path = local_path(value, base)
    candidates = [path, RunFolder(path).adapter]
    if path.is_dir():
        adapters = [RunFolder(p).adapter for p in path.iterdir() if p.is_dir()]
        candidates += sorted((a for a in adapters if (a / "adapter_config.json").is_file()), reverse=True)[:1]
    found = next((c for c in candidates if (c / "adapter_config.json").is_file()), None)
    if found is None:
        said = "does not exist" if not path.exists() else "holds no adapter_config.json (nor an adapter/ that does)"
        raise LeapError(
            f"adapter_path {path} {said}",
            where=f"{where}: adapter_path",
            fix="give a LoRA adapter folder (adapter_config.json and adapter_model.safetensors), a LoRA run of this "
            "project, or its adapter/; a relative path starts at the config file's folder",
        )
    return found


def resolve_adapter(model, base: Path, where: str, peft: dict | None) -> tuple[str | None, dict | None]:
    """(the adapter's folder, the LoRA options the run has: the adapter's shape, with peft_config's other values)."""
    if model.adapter_path is None:
        return None, peft
    if method_of(model).retrieval:
        raise LeapError(
            f"adapter_path continues a LoRA adapter of a chat model; training_type {model.training_type} trains an "
            "encoder",
            where=f"{where}: adapter_path",
            fix="remove adapter_path",
        )
    if model.peft_config is not None and model.peft_config.get("use_peft") is False:
        raise LeapError(
            "adapter_path continues a LoRA adapter, and peft_config says use_peft: false (a full fine-tune)",
            where=f"{where}: adapter_path",
            fix="remove use_peft: false (the adapter is what trains), or remove adapter_path",
        )
    training = model.training_config or {}
    if training.get("reference_adapter") is False and training.get("precompute_ref_log_probs"):
        raise LeapError(
            "reference_adapter: false with precompute_ref_log_probs: the reference log-probs are computed when the "
            "trainer is made, with the adapter's frozen copy - before the bare base can be chosen",
            where=f"{where}: training_config.reference_adapter",
            fix="remove precompute_ref_log_probs (or reference_adapter: false)",
        )
    folder = adapter_folder(model.adapter_path, base, where)
    config = _adapter_config(folder, where)
    shape = {k: config[k] for k in SHAPE_KEYS if config.get(k) is not None}
    if isinstance(shape.get("target_modules"), list):
        shape["target_modules"] = sorted(shape["target_modules"])
    user = model.peft_config or {}
    for key, value in shape.items():
        mine = user.get(key)
        if mine is not None and (sorted(mine) if isinstance(mine, list) else mine) != value:
            raise LeapError(
                f"peft_config.{key} is {mine!r} and the adapter at adapter_path has {key} {value!r}: the run trains "
                "that adapter further, in its own shape",
                where=f"{where}: peft_config.{key}",
                fix=f"remove peft_config.{key} (the adapter's own is used), or start a new adapter without "
                "adapter_path",
            )
    options = {k: v for k, v in (peft or {}).items() if k not in SHAPE_KEYS}
    return str(folder), {**options, **shape}


def _adapter_config(folder: Path, where: str) -> dict:
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise LeapError(
            f"{folder / 'adapter_config.json'} cannot be read ({err})",
            where=f"{where}: adapter_path",
            fix="point adapter_path at an adapter peft saved",
        ) from None
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise LeapError(
            f"the adapter at {folder} is a {config.get('peft_type')} adapter; adapter_path continues LoRA adapters",
            where=f"{where}: adapter_path",
            fix="give a LoRA adapter",
        )
    return config
