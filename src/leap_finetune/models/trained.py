"""A trained model as `chat` and `export` find it: a run folder (its final model, else its adapter, else its
newest intact checkpoint), a checkpoint folder, an adapter folder, a model folder - or any model id.

A LoRA adapter is loaded over the base model its run trained (the run's resolved_config.yaml), else the
base its adapter_config.json records. The chat template is the one the run trained with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from leap_finetune.errors import LeapError
from leap_finetune.methods import is_retrieval, trained_by
from leap_finetune.runs.folder import RunFolder
from leap_finetune.runs.model import is_model, model_in


@dataclass
class TrainedModel:
    model_id: str  # a folder holding a full model, a model id, or the base model of an adapter
    adapter_dir: Path | None = None
    run_config: dict | None = None  # the run's resolved_config.yaml, when the model comes from a run

    @property
    def name(self) -> str:
        return f"{self.adapter_dir} (LoRA adapter over {self.model_id})" if self.adapter_dir else self.model_id


def find_trained(path: str) -> TrainedModel:
    from leap_finetune.models.tiny import TINY_MODELS

    folder = Path(path).expanduser()
    if not folder.exists():
        if path in TINY_MODELS or (not path.startswith((".", "/", "~")) and path.count("/") == 1):
            return TrainedModel(path)  # a Hub id (or a built-in tiny model)
        raise LeapError(
            "no such folder",
            where=path,
            fix="give a run folder (outputs/PROJECT/RUN), a checkpoint-N folder, an adapter folder, a "
            "model folder or a Hub model id",
        )
    if not folder.is_dir():
        raise LeapError("not a folder", where=path, fix="give the run folder, not a file in it")
    found = model_in(folder)
    if found is None:
        raise LeapError(
            "no model here (no config.json, no adapter_config.json, no model/ or adapter/, no complete checkpoint)",
            where=path,
            fix="give a run folder that finished or saved a checkpoint, or a model folder",
        )
    folder = found
    run_config = _run_config(folder)
    if is_model(folder):
        return TrainedModel(str(folder.resolve()), run_config=run_config)
    return TrainedModel(_adapter_base(folder, run_config), adapter_dir=folder.resolve(), run_config=run_config)


def retrieval_type(trained: TrainedModel) -> str | None:
    """`embedding` or `colbert` for a retrieval run's model (its run config says so) or any
    sentence-transformers folder (modules.json; its config_sentence_transformers.json names the class)."""
    training_type = (trained.run_config or {}).get("training_type")
    if is_retrieval(training_type):
        return training_type
    folder = Path(trained.model_id)
    if trained.adapter_dir is None and (folder / "modules.json").is_file():
        try:
            recorded = json.loads((folder / "config_sentence_transformers.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            recorded = {}
        return trained_by(recorded.get("model_type") or "SentenceTransformer")
    return None


def unmerged_lora(folder: Path) -> bool:
    """A LoRA retrieval run's checkpoint-N: its layers hold the adapter unmerged (base_layer, lora_A/B), which
    sentence-transformers would load as fresh layers without a word."""
    from safetensors import safe_open

    for file in Path(folder).glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            if any(".lora_A." in key for key in handle.keys()):
                return True
    return False


def load_trained(trained: TrainedModel, *, merge: bool = False, dtype=None):
    """(model, tokenizer) in eval mode; an adapter over its base (merged into it with `merge`)."""
    import torch

    from leap_finetune.models.loading import load_model, load_tokenizer

    init_kwargs = dict((trained.run_config or {}).get("training", {}).get("model_init_kwargs") or {})
    init_kwargs.pop("dtype", None)
    init_kwargs.pop("quantization_config", None)  # (a merged or chatted-with model is not re-quantized)
    source = trained.adapter_dir if trained.adapter_dir and _has_tokenizer(trained.adapter_dir) else trained.model_id
    tokenizer = (
        load_tokenizer(str(source), None)
        if str(source) != trained.model_id
        else load_tokenizer(trained.model_id, init_kwargs)
    )
    model = load_model(trained.model_id, tokenizer, init_kwargs, dtype=dtype or torch.float32)
    if trained.adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(trained.adapter_dir))
        if merge:
            model = model.merge_and_unload()
    model.eval()
    return model, tokenizer


def chat_template_text(trained: TrainedModel, tokenizer) -> str | None:
    """The template the run trained with (a built-in name or a file), else the tokenizer's own."""
    name = (trained.run_config or {}).get("chat_template")
    if name:
        from leap_finetune.data.chat_templates import load_chat_template

        try:
            return load_chat_template(name, tokenizer).text
        except LeapError:
            pass
    return tokenizer.chat_template


def _run_config(folder: Path) -> dict | None:
    from leap_finetune.config.yaml_io import read_yaml

    for candidate in (RunFolder(folder).resolved_config, RunFolder(folder.parent).resolved_config):
        if candidate.is_file():
            try:
                return read_yaml(candidate)
            except LeapError:
                return None
    return None


def _adapter_base(adapter: Path, run_config: dict | None) -> str:
    if run_config and run_config.get("model_id"):
        return run_config["model_id"]
    try:
        recorded = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8")).get(
            "base_model_name_or_path"
        )
    except (OSError, json.JSONDecodeError):
        recorded = None
    if not recorded:
        raise LeapError(
            "the adapter does not say which model it adapts (no run config beside it, no "
            "base_model_name_or_path in adapter_config.json)",
            where=str(adapter),
            fix="give the run folder the adapter came from",
        )
    return recorded


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").exists() or (folder / "tokenizer.json").exists()
