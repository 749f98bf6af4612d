"""Which model a `model_name` means, and which LFM family (for the chat template) it belongs to."""

from __future__ import annotations

import json
import re
from pathlib import Path

from leap_finetune.models.architectures import ARCHITECTURES, LFM2_TEXT_TYPES
from leap_finetune.models.tiny import TINY_MODELS
from leap_finetune.runs.folder import RunFolder
from leap_finetune.runs.model import finished_model

_LFM_SHORT_NAME = re.compile(r"^LFM2(\.5)?[-_.]", re.IGNORECASE)
VL_NAME = re.compile(r"[-_]VL([-_.]|$)", re.IGNORECASE)  # LiquidAI's LFM2-VL-* / LFM2.5-VL-*
MOE_NAME = re.compile(r"-\d+B-A\d+B", re.IGNORECASE)  # LiquidAI's mixtures of experts: LFM2-8B-A1B, LFM2-24B-A2B


def resolve_model_id(model_name: str, base: Path) -> str:
    """`tiny-lfm2` stays; an existing local folder becomes absolute; `LFM2-1.2B` gets the
    `LiquidAI/` organisation; anything else is a Hub id."""
    if model_name in TINY_MODELS:
        return model_name
    from leap_finetune.config.paths import local_path

    local = local_path(model_name, base)
    if local.is_file():  # (its loading error would advise `hf download` of the file's path)
        from leap_finetune.errors import LeapError

        raise LeapError(
            f"{model_name} is a file ({local}), not a model",
            where="model_name",
            fix="give a model folder (config.json, weights and tokenizer), a Hub id such as LiquidAI/LFM2-1.2B, "
            "or a run of this project",
        )
    # A Hub id has one "/" (org/name): more, or a leading . / ~, is a folder path
    if local.is_dir() or model_name.startswith((".", "/", "~")) or model_name.count("/") > 1:
        found = finished_model(local)
        if found is None:
            _refuse_unfinished(local, model_name)
        return str(found or local)
    if "/" not in model_name and _LFM_SHORT_NAME.match(model_name):
        return f"LiquidAI/{model_name}"
    return model_name


def _refuse_unfinished(folder: Path, model_name: str) -> None:
    """A run folder (or a project folder of runs) without a finished run: said as such, not as a folder that lacks
    tokenizer files."""
    from leap_finetune.errors import LeapError

    if not folder.is_dir() or (folder / "config.json").exists():
        return
    if RunFolder(folder).is_run():
        raise LeapError(
            f"{folder} is a run that has not finished (it has no model/ yet)",
            where="model_name",
            fix="let the run finish (or resume it), or give one of its checkpoint-N folders",
        )
    runs = sorted(p.name for p in folder.iterdir() if RunFolder(p).is_run())
    if runs:
        raise LeapError(
            f"{folder} is a project folder, and none of its runs has finished (no model/ in "
            f"{', '.join(runs[:5])}{' ...' if len(runs) > 5 else ''})",
            where="model_name",
            fix="run (or resume) the config that trains it to the end first, or give a run's checkpoint-N folder",
        )


def model_family(model_name: str, model_id: str) -> str:
    """ "lfm2.5", "lfm2" or "other": decides the default chat template."""
    if model_name in TINY_MODELS:
        return TINY_MODELS[model_name]
    names = [model_name, model_id]
    local = Path(model_id)
    if local.is_dir():
        names.append(_name_in_folder(local))
    text = " ".join(n for n in names if n).lower()
    if re.search(r"lfm2[._-]?5", text):
        return "lfm2.5"
    if "lfm2" in text:
        return "lfm2"
    return "other"


def _name_in_folder(folder: Path) -> str:
    """A fine-tuned checkpoint is recognised by the chat template saved beside it, or by
    config.json's model_type."""
    from leap_finetune.data.chat_templates import family_of_template

    template = None
    if (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    elif (folder / "tokenizer_config.json").exists():
        template = _json(folder / "tokenizer_config.json").get("chat_template")
    family = family_of_template(template if isinstance(template, str) else None)
    if family:
        return family
    if (folder / "config.json").exists() and _json(folder / "config.json").get("model_type") in LFM2_TEXT_TYPES:
        return "lfm2"
    return ""


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, OSError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def config_json(model_id: str) -> dict | None:
    """A model's config.json without loading it: a local folder's, or the Hub cache's; else None."""
    path = Path(model_id) / "config.json"
    if not path.is_file():
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_id, "config.json")
        except Exception:  # noqa: BLE001 - not a valid repo id: decide by name
            return None
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def model_type(model_id: str) -> str | None:
    """config.json's model_type (the built-in tiny models: theirs); LiquidAI's LFM2 names without a
    config at hand count as "lfm2"; None when unknown."""
    from leap_finetune.models.tiny import TINY_MODEL_TYPES

    if model_id in TINY_MODELS:
        return TINY_MODEL_TYPES[model_id]
    config = config_json(model_id)
    if config is not None:
        return config.get("model_type")
    name = model_id.rsplit("/", 1)[-1]
    if _LFM_SHORT_NAME.match(name) and not VL_NAME.search(name):
        return "lfm2_moe" if MOE_NAME.search(name) else "lfm2"
    return None


# Model types whose attention layers take padding-free (varlen) batches (models/varlen_attention.py, checked by
# tests/models/test_varlen_attention.py; lfm2_vl: its language model's).
VARLEN_MODEL_TYPES = {kind for kind, found in ARCHITECTURES.items() if found.varlen_attention}
