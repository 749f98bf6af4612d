"""Embedding (bi-encoder) recipe: sentence-transformers' SentenceTransformerTrainer with in-batch negatives
(MultipleNegativesRankingLoss, or its GradCache variant for large batches).

Read top-down: the model (an existing sentence-transformers model, or a backbone + pooling + normalisation)
-> the loss -> recipes/retrieval.py's train, evaluate (nDCG@10, MRR@10, recall@k), save.
"""

from __future__ import annotations

from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.recipes import retrieval
from leap_finetune.recipes.retrieval import training_arguments  # noqa: F401 - the recipe interface


def config_class():
    from sentence_transformers import SentenceTransformerTrainingArguments

    return SentenceTransformerTrainingArguments


def pooling_mode(resolved: ResolvedConfig, config) -> str:
    """`auto`: last-token pooling for a causal LM (LFM2's embedding models read the last token), mean pooling
    for an encoder."""
    mode = resolved.retrieval.pooling
    if mode != "auto":
        return mode
    causal = any(a.endswith("ForCausalLM") for a in (getattr(config, "architectures", None) or [])) or \
        getattr(config, "model_type", "") in ("lfm2", "lfm2_moe")
    return "lasttoken" if causal else "mean"


def build_model(resolved: ResolvedConfig, console):
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = Path(retrieval.backbone(resolved))
    if (folder / "modules.json").exists():  # already a sentence-transformers model
        model = SentenceTransformer(str(folder), device=device)
        console.print(f"model: the sentence-transformers model {resolved.model_id}")
    else:
        transformer = Transformer(str(folder))
        mode = pooling_mode(resolved, transformer.auto_model.config)
        pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode=mode)
        model = SentenceTransformer(modules=[transformer, pooling, Normalize()], device=device)
        console.print(f"model: {resolved.model_id} with {mode} pooling and normalised embeddings")
    retrieval.set_prompts_and_length(model, resolved, _max_length(resolved))
    return model


def _max_length(resolved: ResolvedConfig) -> int | None:
    r = resolved.retrieval
    lengths = [x for x in (r.query_max_length, r.document_max_length) if x]
    return max(lengths) if lengths else None


def build_loss(resolved: ResolvedConfig, model):
    from sentence_transformers import losses

    gather = retrieval.several_workers()
    if resolved.retrieval.loss == "cached_mnrl":
        return losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=resolved.retrieval.mini_batch_size,
                                                         gather_across_devices=gather)
    return losses.MultipleNegativesRankingLoss(model, gather_across_devices=gather)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    from sentence_transformers import SentenceTransformerTrainer

    return retrieval.train(resolved_json, model_factory=build_model, loss_factory=build_loss,
                           trainer_cls=SentenceTransformerTrainer, args_cls=config_class(), multi_vector=False,
                           callbacks=callbacks)
