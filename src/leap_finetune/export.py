"""`leap-finetune export`: a trained model as a folder of its own, ready for transformers, vLLM or a GGUF
conversion - with `--merge`, a LoRA adapter merged into its base model (what vLLM and llama.cpp load best).
An embedding or ColBERT model is exported as a sentence-transformers folder (its pooling, projection and
prompts kept), always merged.

Written to a temporary folder beside the target and renamed into place: an interrupted export leaves
nothing half-written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console

from leap_finetune.errors import LeapError
from leap_finetune.methods import METHODS
from leap_finetune.models.trained import TrainedModel, find_trained
from leap_finetune.models.vision import is_vision_model


def export_model(
    source: str, *, merge: bool = False, output: str | Path | None = None, console: Console | None = None
) -> Path:
    trained = find_trained(source)
    if output is None:
        base = Path(source).expanduser()
        output = (base if base.is_dir() else Path.cwd()) / ("export-merged" if merge else "export")
    return export_trained(trained, merge=merge, output=output, console=console)


def export_trained(trained: TrainedModel, *, merge: bool, output: str | Path, console: Console | None = None) -> Path:
    """`trained` written to `output` (a new or empty folder): an adapter as it is, or a full model."""
    console = console or Console(stderr=True)
    output = Path(output).expanduser().resolve()
    if output.exists() and any(output.iterdir()):
        raise LeapError(
            "the output folder exists and is not empty",
            where=str(output),
            fix="choose another --output, or remove the folder",
        )
    kind = trained.retrieval_type()
    if kind is not None:
        return _export_encoder(trained, kind, merge, output, console)
    from leap_finetune.quiet import quiet_libraries

    quiet_libraries()  # (transformers' loading and writing bars, peft's deprecation notices)
    if trained.adapter_dir is not None and not merge:
        return _export_adapter(trained, output, console)
    return _export_full(trained, output, console)


def _export_adapter(trained: TrainedModel, output: Path, console: Console) -> Path:
    # a vision-language adapter carries its processor too: AutoProcessor.from_pretrained(output) loads
    processor = _processor(trained, trained.tokenizer(), console) if is_vision_model(trained.model_id) else None

    def copy(path: Path) -> None:
        shutil.copytree(trained.adapter_dir, path)
        if processor is not None:
            processor.save_pretrained(path)

    _stage(output, copy)
    console.print(
        f"exported the LoRA adapter {trained.adapter_dir} (over {trained.model_id}) to {output}"
        + (" with its processor" if processor is not None else "")
        + "; --merge writes a full model instead",
        markup=False,
    )
    return output


def _export_full(trained: TrainedModel, output: Path, console: Console) -> Path:
    """A full model (an adapter merged into its base): the run's chat template, the base model's dtype."""
    vision = is_vision_model(trained.model_id)
    model, tokenizer = trained.load(merge=True)  # merged in float32
    dtype = _base_dtype(trained.model_id)
    if dtype is not None:
        model = model.to(dtype)  # saved in the dtype of the base model's weights (bf16 for LFM2 checkpoints)
    template = trained.chat_template(tokenizer)
    if template:
        tokenizer.chat_template = template  # the template the run trained with travels with the model
    # a vision-language model is saved with its processor (image settings, tokenizer, chat template), as a run's
    # model/ is: the folder loads with AutoProcessor and AutoModelForImageTextToText
    saver = (_processor(trained, tokenizer, console) if vision else None) or tokenizer

    def write(path: Path) -> None:
        model.save_pretrained(path)
        saver.save_pretrained(path)

    _stage(output, write)
    what = f"{trained.adapter_dir} merged into {trained.model_id}" if trained.adapter_dir else trained.model_id
    loads = (
        "a full vision-language model with its processor: AutoModelForImageTextToText and AutoProcessor.from_pretrained"
        if vision
        else "a full model: AutoModelForCausalLM.from_pretrained, vLLM, or a GGUF conversion"
    )
    console.print(f"exported {what} to {output} ({loads}; docs/export.md)", markup=False)
    return output


def _processor(trained: TrainedModel, tokenizer, console: Console):
    """The vision-language model's processor around the exported tokenizer, or None (said) where it cannot be
    built: without torchvision, or without processor files here or in the run's base model."""
    try:
        return trained.processor(tokenizer, trained.chat_template(tokenizer))
    except LeapError as err:
        console.print(
            f"warning: exported without the image processor ({err.message}); AutoProcessor will not load the "
            f"folder: {err.fix or 'copy the base model processor files into it'}",
            markup=False,
        )
        return None


def _export_encoder(trained: TrainedModel, kind: str, merge: bool, output: Path, console: Console) -> Path:
    """A sentence-transformers folder (SentenceTransformer / MultiVectorEncoder loads it): a LoRA run's
    checkpoint is merged whether or not --merge is given - the sentence-transformers this release pins loads no
    separate adapter, and the adapter alone would lose the pooling and a trained projection."""
    from leap_finetune.quiet import quiet_libraries
    from leap_finetune.recipes.retrieval import load_encoder

    if trained.adapter_dir is not None:
        raise LeapError(
            f"the adapter of a {kind} run holds the backbone's LoRA weights only, not the model's pooling "
            "or its trained projection",
            where=str(trained.adapter_dir),
            fix="export the run folder (its model/ has the adapter merged) or one of its checkpoint-N",
        )
    quiet_libraries()
    model, merged = load_encoder(Path(trained.model_id), trained.run_config, kind)
    _stage(output, lambda path: model.save_pretrained(str(path), create_model_card=False))
    cls = METHODS[kind].encoder_class
    note = (
        " (the LoRA adapter merged: a retrieval model is always exported merged)"
        if merged and not merge
        else " (the LoRA adapter merged)"
        if merged
        else ""
    )
    console.print(
        f"exported the {kind} model {trained.model_id}{note} to {output} (a sentence-transformers folder: "
        f"{cls}({str(output)!r}); docs/retrieval.md)",
        markup=False,
    )
    return output


def _base_dtype(model_id: str):
    """The dtype the base model's config records (None: keep float32; the built-in tiny models)."""
    import torch

    from leap_finetune.models.tiny import TINY_MODELS

    if model_id in TINY_MODELS:
        return None
    try:
        from transformers import AutoConfig

        recorded = getattr(AutoConfig.from_pretrained(model_id), "dtype", None)
    except Exception:  # noqa: BLE001 - no config to read: keep float32
        return None
    recorded = getattr(torch, recorded) if isinstance(recorded, str) else recorded
    return recorded if recorded in (torch.bfloat16, torch.float16) else None


def _stage(output: Path, write) -> None:
    from leap_finetune.runs.atomic import replace_folder

    replace_folder(output, write)  # (an existing output is an empty folder here: a full one was refused)
