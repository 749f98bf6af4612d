"""What an asynchronous evaluation works on: a snapshot of the model at one training step (a plain
from_pretrained folder, LoRA merged without touching the training weights) and the outcome it reports."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Snapshot:
    step: int
    when: str
    folder: Path  # model/ (a full model folder) and eval.yaml; results.json once evaluated
    epoch: float | None = None  # the trainer's epoch at that step (logged with the results)


@dataclass
class Outcome:
    results: dict | None = None
    reason: str | None = None  # why it failed
    log: Path | None = None  # where to read more
    seconds: float | None = None  # how long the evaluation itself took (a server's start left out)


def save_full_model(trainer, folder: Path, template_text: str, processor=None) -> None:
    """The model as a plain from_pretrained folder (LoRA merged, without changing the training weights),
    with the tokenizer whose chat template is the one the benchmarks render with (an evaluation server applies
    the tokenizer's template). `processor`: a vision-language model's, saved too (its image settings), so that
    an evaluation server on the folder takes images."""
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    save_model_folder(model, folder)
    tokenizer = trainer.processing_class
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
    if processor is not None:  # (first: the tokenizer and the template below are the ones that count)
        processor.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    (folder / "chat_template.jinja").write_text(template_text, encoding="utf-8")
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.exists():  # an older layout keeps the template inside the config too
        data = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        if "chat_template" in data:
            data["chat_template"] = template_text
            tokenizer_config.write_text(json.dumps(data, indent=2), encoding="utf-8")


def save_model_folder(model, folder: Path) -> None:
    """A model, or a peft model with its adapters merged, saved as a plain from_pretrained folder."""
    if not hasattr(model, "peft_config"):
        model.save_pretrained(str(folder))
        return
    base, state_dict = model.get_base_model(), merged_state_dict(model)
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    tied = bool(getattr(config, "tie_word_embeddings", False))
    output, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    names = {id(p): n for n, p in base.named_parameters(remove_duplicate=False)}
    head = (
        next(
            (
                n.replace(".base_layer", "").replace(".modules_to_save.default", "")
                for n, p in base.named_parameters(remove_duplicate=False)
                if p is getattr(output, "weight", None)
            ),
            None,
        )
        if output is not None
        else None
    )
    embed = names.get(id(getattr(embeddings, "weight", None)))
    untie = tied and head in state_dict and embed in state_dict and not torch_equal(state_dict[head], state_dict[embed])
    if untie:  # the adapter changed the output head or the embeddings apart: saved as two matrices (as peft does)
        config.tie_word_embeddings = False
    try:
        base.save_pretrained(str(folder), state_dict=state_dict)
    finally:
        if untie:
            config.tie_word_embeddings = True


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b))


def merged_state_dict(model) -> dict:
    """The weights of a peft LoRA model with every adapter merged, as the base model's own state dict. Each
    LoRA layer is merged on a copy of that layer only (peft's own merge: DoRA and scaling included), so the
    training weights are not touched and memory grows by one layer, not one model."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged_layers = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            layer = copy.deepcopy(module)
            layer.merge()
            for key, value in layer.get_base_layer().state_dict().items():
                merged_layers[f"{name}.{key}"] = value
    state = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key or "lora_magnitude_vector" in key or ".original_module." in key:
            continue
        key = key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        state[key] = value
    state.update(merged_layers)
    return {k: v.detach().contiguous() for k, v in state.items()}
