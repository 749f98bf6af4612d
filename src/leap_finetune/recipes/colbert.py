"""ColBERT (late interaction) recipe: sentence-transformers' MultiVectorEncoderTrainer with its contrastive
MaxSim loss (or the GradCache variant for large batches).

An existing ColBERT / PyLate / sentence-transformers model loads as it is (sentence-transformers converts
the latter with a 128-dimension projection); any other backbone gets the same projection.
"""

from __future__ import annotations

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.methods import METHODS
from leap_finetune.models.encoders import build_colbert_model as build_model
from leap_finetune.recipes import retrieval
from leap_finetune.recipes.retrieval import training_arguments  # noqa: F401 - the recipe interface


def config_class():
    """The training arguments of this type (methods/ names the class)."""
    return METHODS["colbert"].arguments_class()


def build_loss(resolved: ResolvedConfig, model):
    from sentence_transformers.multi_vector_encoder.losses import (
        CachedMultiVectorMultipleNegativesRankingLoss,
        MultiVectorMultipleNegativesRankingLoss,
    )

    options = retrieval.loss_options(resolved.retrieval)
    if resolved.retrieval.loss == "cached_mnrl":
        return CachedMultiVectorMultipleNegativesRankingLoss(
            model, mini_batch_size=resolved.retrieval.mini_batch_size, **options
        )
    return MultiVectorMultipleNegativesRankingLoss(model, **options)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoderTrainer

    return retrieval.train(
        resolved_json,
        model_factory=build_model,
        loss_factory=build_loss,
        trainer_cls=MultiVectorEncoderTrainer,
        args_cls=config_class(),
        multi_vector=True,
        callbacks=callbacks,
    )
