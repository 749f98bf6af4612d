"""Embedding (bi-encoder) recipe: sentence-transformers' SentenceTransformerTrainer with in-batch negatives
(MultipleNegativesRankingLoss, or its GradCache variant for large batches).

Read top-down: the model (an existing sentence-transformers model, or a backbone + pooling + normalisation)
-> the loss -> recipes/retrieval.py's train, evaluate (nDCG@10, MRR@10, recall@k), save.
"""

from __future__ import annotations

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.methods import METHODS
from leap_finetune.models.encoders import build_embedding_model as build_model
from leap_finetune.recipes import retrieval
from leap_finetune.recipes.retrieval import training_arguments  # noqa: F401 - the recipe interface


def config_class():
    """The training arguments of this type (methods/ names the class)."""
    return METHODS["embedding"].arguments_class()


def build_loss(resolved: ResolvedConfig, model):
    from sentence_transformers.sentence_transformer import losses  # (the top-level `losses` is deprecated)

    options = retrieval.loss_options(resolved.retrieval)
    if resolved.retrieval.loss == "cached_mnrl":
        return losses.CachedMultipleNegativesRankingLoss(
            model, mini_batch_size=resolved.retrieval.mini_batch_size, **options
        )
    return losses.MultipleNegativesRankingLoss(model, **options)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    from sentence_transformers import SentenceTransformerTrainer

    return retrieval.train(
        resolved_json,
        model_factory=build_model,
        loss_factory=build_loss,
        trainer_cls=SentenceTransformerTrainer,
        args_cls=config_class(),
        multi_vector=False,
        callbacks=callbacks,
    )
