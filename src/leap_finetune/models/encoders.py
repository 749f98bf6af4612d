"""Embedding and ColBERT models as sentence-transformers builds them from a config: the backbone (a built-in tiny
model saved to the run folder first), the pooling or the projection, the prompts and the length. Used by the
recipes (training), `eval` (a checkpoint scored) and `export` (a LoRA checkpoint rebuilt): models/, below all three.
"""

from __future__ import annotations

from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.methods import method_of


def build_encoder(resolved: ResolvedConfig, console):
    """The model the run's training type trains: one vector per text, or one per token (ColBERT)."""
    build = build_colbert_model if method_of(resolved).multi_vector else build_embedding_model
    return build(resolved, console)


def pooling_mode(resolved: ResolvedConfig, config) -> str:
    """`auto`: last-token pooling for a causal LM (LFM2's embedding models read the last token), mean pooling
    for an encoder."""
    mode = resolved.retrieval.pooling
    if mode != "auto":
        return mode
    from leap_finetune.models.architectures import LFM2_TEXT_TYPES

    causal = (
        any(a.endswith("ForCausalLM") for a in (getattr(config, "architectures", None) or []))
        or getattr(config, "model_type", "") in LFM2_TEXT_TYPES
    )
    return "lasttoken" if causal else "mean"


def build_embedding_model(resolved: ResolvedConfig, console):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = Path(backbone(resolved))
    if (folder / "modules.json").exists():  # already a sentence-transformers model
        model = SentenceTransformer(str(folder), device=device)
        console.print(f"model: the sentence-transformers model {resolved.model_id}")
    else:
        transformer = Transformer(str(folder))
        mode = pooling_mode(resolved, transformer.auto_model.config)
        pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=mode)
        model = SentenceTransformer(modules=[transformer, pooling, Normalize()], device=device)
        console.print(f"model: {resolved.model_id} with {mode} pooling and normalised embeddings")
    set_prompts_and_length(model, resolved, max_length(resolved))
    return model


def max_length(resolved: ResolvedConfig) -> int | None:
    r = resolved.retrieval
    lengths = [x for x in (r.query_max_length, r.document_max_length) if x]
    return max(lengths) if lengths else None


def build_colbert_model(resolved: ResolvedConfig, console):
    import torch
    from sentence_transformers import MultiVectorEncoder

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = MultiVectorEncoder(backbone(resolved), device=device)
    console.print(f"model: {resolved.model_id} as a multi-vector (ColBERT) encoder")
    set_prompts_and_length(model, resolved, max_length(resolved))
    return model


def backbone(resolved: ResolvedConfig) -> str:
    """What sentence-transformers loads: the model id, or for a built-in tiny model a folder it is saved to
    (in the run folder: sentence-transformers loads models by name or path only)."""
    from leap_finetune.models.tiny import TINY_MODELS

    if resolved.model_id not in TINY_MODELS:
        return resolved.model_id
    folder = Path(resolved.run_dir) / "base_model"
    if not (folder / "config.json").exists():  # the driver saves it (launch/run_folder.py), before any worker
        save_tiny_backbone(resolved, Path(resolved.run_dir))
    return str(folder)


def save_tiny_backbone(resolved: ResolvedConfig, run_folder: Path) -> None:
    """A built-in tiny model saved as run_folder/base_model (nothing for other models)."""
    from leap_finetune.models.tiny import (
        TINY_MODELS,
        build_tiny_model,
        load_tiny_tokenizer,
    )

    if resolved.model_id not in TINY_MODELS:
        return
    tokenizer = load_tiny_tokenizer(resolved.model_id)
    build_tiny_model(resolved.model_id, tokenizer).save_pretrained(run_folder / "base_model")
    tokenizer.save_pretrained(run_folder / "base_model")


def set_prompts_and_length(model, resolved: ResolvedConfig, encoder_max: int | None) -> None:
    """The prompts travel with the saved model (encode(..., prompt_name="query")); the model reads texts up to
    the longer side's limit (each side was already cut to its own in the data step)."""
    prompts = resolved.retrieval.prompts
    saved = {k: v for k, v in (("query", prompts.query), ("document", prompts.document)) if v}
    if saved:
        model.prompts = {**(model.prompts or {}), **saved}
    if encoder_max:
        model.max_seq_length = encoder_max
    # (its model card's widget examples print a progress bar into the run's output at the start of training,
    # whatever generate_widget_examples says)
    model.model_card_data.generate_widget_examples = False
    model.model_card_data.set_widget_examples = lambda dataset: None
