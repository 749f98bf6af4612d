"""A trained model as `chat`, `export` and `eval` find and load it: a run folder (its final model, else its adapter,
else its newest intact checkpoint), a checkpoint folder, an adapter folder, a model folder - or any model id; for
`eval`'s `checkpoint:`, a GGUF file too.

A LoRA adapter is loaded over the base model its run trained (the run's resolved_config.yaml), else the
base its adapter_config.json records. The chat template is the one the run trained with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from leap_finetune.errors import LeapError
from leap_finetune.methods import is_retrieval, trained_by
from leap_finetune.models.tiny import TINY_MODELS
from leap_finetune.runs.folder import RunFolder
from leap_finetune.runs.model import is_model, model_in


@dataclass
class TrainedModel:
    """What is in the folder the user gave, and how it loads: the one answer `chat`, `export` and `eval` share."""

    model_id: str  # a folder holding a full model, a model id, or the base model of an adapter (GGUF: its folder)
    adapter_dir: Path | None = None
    run_config: dict | None = None  # the run's resolved_config.yaml, when the model comes from a run
    gguf_file: Path | None = None  # a GGUF file (`export --gguf`), which transformers reads dequantised

    @property
    def name(self) -> str:
        if self.gguf_file is not None:
            return f"{self.gguf_file} (GGUF, dequantised)"
        return f"{self.adapter_dir} (LoRA adapter over {self.model_id})" if self.adapter_dir else self.model_id

    def retrieval_type(self) -> str | None:
        """`embedding` or `colbert` for a retrieval run's model (its run config says so) or any
        sentence-transformers folder (modules.json; its config_sentence_transformers.json names the class)."""
        training_type = (self.run_config or {}).get("training_type")
        if is_retrieval(training_type):
            return training_type
        folder = Path(self.model_id)
        if self.adapter_dir is None and (folder / "modules.json").is_file():
            try:
                recorded = json.loads((folder / "config_sentence_transformers.json").read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                recorded = {}
            return trained_by(recorded.get("model_type") or "SentenceTransformer")
        return None

    def tokenizer(self):
        """The tokenizer saved beside the adapter (the run's), else the model's."""
        from leap_finetune.models.loading import load_tokenizer

        if self.adapter_dir is not None and _has_tokenizer(self.adapter_dir):
            return load_tokenizer(str(self.adapter_dir), None)
        return load_tokenizer(self.model_id, self._init_kwargs())

    def load(self, *, merge: bool = False, dtype=None):
        """(model, tokenizer) in eval mode; an adapter over its base (merged into it with `merge`)."""
        import torch

        from leap_finetune.models.loading import load_model

        tokenizer = self.tokenizer()
        model = load_model(self.model_id, tokenizer, self._init_kwargs(), dtype=dtype or torch.float32)
        if self.adapter_dir is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(self.adapter_dir))
            if merge:
                model = model.merge_and_unload()
        model.eval()
        return model, tokenizer

    def chat_template(self, tokenizer) -> str | None:
        """The template the run trained with (a built-in name or a file), else the tokenizer's own."""
        name = (self.run_config or {}).get("chat_template")
        if name:
            from leap_finetune.data.chat_templates import load_chat_template

            try:
                return load_chat_template(name, tokenizer).text
            except LeapError:
                pass
        return tokenizer.chat_template

    def processor(self, tokenizer, template: str | None):
        """The processor of a vision-language model, sharing the tokenizer (and the chat template) chat renders
        with. A training checkpoint holds no processor files: fine-tuning does not change how images are prepared,
        so the base model's processor (the run's model_id) is used, with the run's `image_processor:` settings (what
        its model/ is saved with). An adapter's base is that base model too."""
        from leap_finetune.models.vision import has_processor_files, load_processor

        source, settings = self.model_id, None
        if self.adapter_dir is not None or not has_processor_files(source):
            recorded = (self.run_config or {}).get("image_processor")
            settings = {k: v for k, v in recorded.items() if v is not None} if isinstance(recorded, dict) else None
        if not has_processor_files(source):
            base = (self.run_config or {}).get("model_id")
            if not base or not has_processor_files(base):
                raise LeapError(
                    "the folder has no processor files (processor_config.json / preprocessor_config.json): the "
                    "images cannot be prepared for the model",
                    where=source,
                    fix="give the run folder (its model/ is saved with its processor), or copy the base model's "
                    "processor_config.json (or preprocessor_config.json) into the folder",
                )
            source = base
        processor = load_processor(source, tokenizer, settings) if settings else load_processor(source, tokenizer)
        if template:
            processor.chat_template = template
        return processor

    def _init_kwargs(self) -> dict:
        """The run's model_init_kwargs, less its dtype and quantization (a merged or chatted-with model is not
        re-quantized)."""
        init_kwargs = dict((self.run_config or {}).get("training", {}).get("model_init_kwargs") or {})
        init_kwargs.pop("dtype", None)
        init_kwargs.pop("quantization_config", None)
        return init_kwargs


def find_trained(path: str) -> TrainedModel:
    """`chat` and `export`: the model in a folder (absolute paths), or a model id."""
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
    trained = trained_in(folder)
    if trained is None:
        raise LeapError(
            "no model here (no config.json, no adapter_config.json, no model/ or adapter/, no complete checkpoint)",
            where=path,
            fix="give a run folder that finished or saved a checkpoint, or a model folder",
        )
    if trained.adapter_dir is not None:
        return replace(trained, adapter_dir=trained.adapter_dir.resolve())
    return replace(trained, model_id=str(Path(trained.model_id).resolve()))


def trained_in(folder: Path, base: str | None = None) -> TrainedModel | None:
    """The model runs/model.model_in picks in `folder` (None when there is none), with its run's config. An
    adapter's base model: the run's, else the one adapter_config.json records, else `base` (eval's model_name)."""
    found = model_in(folder)
    if found is None:
        return None
    run_config = _run_config(found)
    if is_model(found):
        return TrainedModel(str(found), run_config=run_config)
    return TrainedModel(_adapter_base(found, run_config, base), adapter_dir=found, run_config=run_config)


def unmerged_lora(folder: Path) -> bool:
    """A LoRA retrieval run's checkpoint-N: its layers hold the adapter unmerged (base_layer, lora_A/B), which
    sentence-transformers would load as fresh layers without a word."""
    from safetensors import safe_open

    for file in Path(folder).glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            if any(".lora_A." in key for key in handle.keys()):
                return True
    return False


def _run_config(folder: Path) -> dict | None:
    from leap_finetune.config.yaml_io import read_yaml

    for candidate in (RunFolder(folder).resolved_config, RunFolder(folder.parent).resolved_config):
        if candidate.is_file():
            try:
                return read_yaml(candidate)
            except LeapError:
                return None
    return None


def _adapter_base(adapter: Path, run_config: dict | None, base: str | None) -> str:
    if run_config and run_config.get("model_id"):
        return run_config["model_id"]
    try:
        recorded = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8")).get(
            "base_model_name_or_path"
        )
    except (OSError, json.JSONDecodeError):
        recorded = None
    if not recorded and not base:
        raise LeapError(
            "the adapter does not say which model it adapts (no run config beside it, no "
            "base_model_name_or_path in adapter_config.json)",
            where=str(adapter),
            fix="give the run folder the adapter came from",
        )
    return recorded or base


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").exists() or (folder / "tokenizer.json").exists()
