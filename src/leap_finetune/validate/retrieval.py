"""embedding / colbert: the `retrieval:` block and what a sentence-transformers run cannot take (text backbones only,
retrieval benchmarks only, no FSDP, no accumulated in-batch negatives)."""

from __future__ import annotations

import importlib.util

from leap_finetune.config.schema import LeapConfigModel, RetrievalConfig
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of


def resolve_retrieval(model: LeapConfigModel, training: dict, where: str) -> RetrievalConfig | None:
    if not method_of(model).retrieval:
        if model.retrieval is not None:
            raise LeapError(
                f"'retrieval:' applies to training_type embedding or colbert, and training_type is "
                f"{model.training_type}",
                where=where,
                fix="remove retrieval, or set training_type: embedding",
            )
        return None
    from leap_finetune.models.tiny import TINY_MODELS

    if importlib.util.find_spec("sentence_transformers") is None:
        raise LeapError(
            f"training_type {model.training_type} trains with sentence-transformers, which is not installed",
            where=f"{where}: training_type",
            fix="pip install 'leap-finetune[retrieval]'",
        )
    if model.model_name in TINY_MODELS and model.model_name not in ("tiny-lfm2", "tiny-lfm2.5"):
        raise LeapError(
            f"{model.model_name} is not a text model: it cannot be a {model.training_type} backbone",
            where=f"{where}: model_name",
            fix="use tiny-lfm2, an LFM2 model, or a sentence-transformers "
            "model or encoder folder (e.g. all-MiniLM-L6-v2)",
        )
    for index, bench in enumerate(model.evals.benchmarks if model.evals is not None else []):
        if bench.metric != "retrieval":
            raise LeapError(
                f"benchmark '{bench.name}' has metric {bench.metric}: an {model.training_type} model "
                "generates no text, so only retrieval benchmarks apply",
                where=f"{where}: evals.benchmarks[{index}].metric",
                fix="use metric: retrieval with a folder of corpus.jsonl, queries.jsonl and qrels/test.tsv "
                '(docs/retrieval.md, "Retrieval benchmarks"); the held-out rows are scored anyway',
            )
    if training.get("fsdp"):
        raise LeapError(
            f"FSDP does not apply to {model.training_type} training: its workers each "
            "hold the whole model (DDP) and gather the documents of every worker",
            where=f"{where}: training_config.fsdp",
            fix="remove fsdp (a retrieval model fits on each GPU; "
            "for a large one use LoRA with peft_config, or a smaller per_device_train_batch_size with "
            "retrieval.loss: cached_mnrl)",
        )
    for key in ("modules_to_save", "trainable_token_indices"):
        if (model.peft_config or {}).get(key):
            raise LeapError(
                f"peft_config.{key} does not apply to {model.training_type} training: the LoRA layers are "
                "merged into the saved model, and these modules would not be",
                where=f"{where}: peft_config.{key}",
                fix=f"remove {key} (a ColBERT projection or Dense layer after the backbone is trained fully anyway)",
            )
    accumulation = training.get("gradient_accumulation_steps", 1)
    if accumulation > 1:
        raise LeapError(
            f"{accumulation} accumulation steps: with in-batch negatives, "
            "accumulated small batches are not one large batch (each query only sees the documents of "
            "its own small batch)",
            where=f"{where}: training_config.gradient_accumulation_steps",
            fix="set it to 1, and for a large effective batch use retrieval.loss: cached_mnrl with a large "
            "per_device_train_batch_size (GradCache keeps memory at mini_batch_size rows)",
        )
    return model.retrieval or RetrievalConfig()
