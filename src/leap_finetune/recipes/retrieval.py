"""What the embedding and ColBERT recipes share, on sentence-transformers: the model (an existing
sentence-transformers / ColBERT model, or a backbone given pooling), the loss, the retrieval evaluator over
the held-out rows, and train -> evaluate -> save.

Nothing here reimplements sentence-transformers: its trainers, losses, batch sampler (no duplicate texts in
a batch), evaluators and saving are used as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.recipes import common
from leap_finetune.recipes.callbacks import StopOnSignal
from leap_finetune.recipes.checkpoints import write_atomic

EVAL_NAME = "retrieval"  # metrics are logged as eval_retrieval_<score>_ndcg@10, ...


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    args = common.common_arguments(resolved, run_dir=run_dir, has_eval=has_eval, cuda=cuda)
    # sentence-transformers' inputs have no input_ids column for the Trainer to count
    args["include_num_input_tokens_seen"] = "no"
    prompts = resolved.retrieval.prompts if resolved.retrieval is not None else None
    if prompts is not None and (prompts.query or prompts.document):
        # column -> prompt; sentence-transformers puts it before each text (and counts it in pooling)
        columns = {"query": prompts.query, "positive": prompts.document}
        columns.update({f"negative_{i}": prompts.document for i in range(1, 65)})
        args["prompts"] = {k: v for k, v in columns.items() if v}
    return args


def evaluator(resolved: ResolvedConfig, train, eval_rows, multi_vector: bool):
    """nDCG@10, MRR@10, recall@k of the held-out queries over every document of the data (train and held-out
    positives and negatives), each held-out query's positive the relevant one."""
    if eval_rows is None:
        return None
    documents: dict[str, str] = {}

    def doc_id(text: str) -> str:
        return documents.setdefault(text, f"d{len(documents)}")

    relevant, queries = {}, {}
    for index, row in enumerate(eval_rows):
        queries[f"q{index}"] = row["query"]
        relevant[f"q{index}"] = {doc_id(row["positive"])}
    for split in (train, eval_rows):
        for row in split:
            for key, value in row.items():
                if key != "query" and value:
                    doc_id(value)
    corpus = {i: text for text, i in documents.items()}
    prompts = resolved.retrieval.prompts
    kwargs = dict(name=EVAL_NAME, mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1, 10],
                  precision_recall_at_k=[1, 10], map_at_k=[10], query_prompt=prompts.query,
                  corpus_prompt=prompts.document, write_csv=False)
    if multi_vector:
        from sentence_transformers.multi_vector_encoder.evaluation import MultiVectorInformationRetrievalEvaluator

        return MultiVectorInformationRetrievalEvaluator(queries, corpus, relevant, **kwargs)
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    return InformationRetrievalEvaluator(queries, corpus, relevant, **kwargs)


def main_score(metrics: dict) -> tuple[str, float] | None:
    """The held-out nDCG@10, whatever the score function is called (cosine, maxsim, ...)."""
    for key, value in metrics.items():
        if key.startswith(f"eval_{EVAL_NAME}_") and key.endswith("_ndcg@10"):
            return key, float(value)
    return None


def train(resolved_json: dict, *, model_factory, loss_factory, trainer_cls, args_cls, multi_vector: bool,
          callbacks: list | None = None) -> dict:
    from rich.console import Console
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    resolved = ResolvedConfig.model_validate(resolved_json)
    common.quiet_libraries()
    run_dir = Path(resolved.run_dir)
    console = Console(stderr=True)
    train_dataset, eval_dataset = common.load_prepared(run_dir)
    args = args_cls(**training_arguments(resolved, run_dir=str(run_dir), has_eval=eval_dataset is not None))
    model = model_factory(resolved, console)
    stop_on_signal = StopOnSignal()
    trainer = trainer_cls(
        model=model, args=args, train_dataset=train_dataset,
        eval_dataset=eval_dataset.select_columns(["query", "positive"]) if eval_dataset is not None else None,
        loss=loss_factory(resolved, model), evaluator=evaluator(resolved, train_dataset, eval_dataset, multi_vector),
        callbacks=common.standard_callbacks(resolved, run_dir, console, stop_on_signal, callbacks),
    )
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    main = common.is_main_process()
    resume = resolved.resume_checkpoint_path
    baseline = trainer.evaluate() if eval_dataset is not None and not resume else None
    result = trainer.train(resume_from_checkpoint=resume)
    finished = trainer.state.global_step >= trainer.state.max_steps
    # every rank evaluates (the evaluation loss is gathered over the workers)
    final = trainer.evaluate() if finished and eval_dataset is not None else None
    if not main:
        return {"global_step": trainer.state.global_step}
    history = common.metrics_history(run_dir / "metrics.jsonl")
    # (fewer steps than logging_steps log no loss: the Trainer's own mean then)
    train_loss = history["train_loss"] if history["train_loss"] is not None else result.training_loss
    summary = {"global_step": trainer.state.global_step, "train_loss": train_loss}
    if not finished:
        summary.update(stopped_early=True, stopped_by_signal=stop_on_signal.received)
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
        return summary
    if final is not None:
        summary["eval_metrics"] = {k: float(v) for k, v in final.items() if isinstance(v, (int, float))}
        score = main_score(final)
        if score is not None:
            summary["ndcg@10"] = score[1]
            first = main_score(baseline or history.get("initial_eval") or {})
            summary["initial_ndcg@10"] = first[1] if first else None
    common._save_atomic(run_dir / "model", lambda path: model.save_pretrained(str(path)))
    summary["model_dir"] = str(run_dir / "model")
    cls = "MultiVectorEncoder" if multi_vector else "SentenceTransformer"
    prompt = ", prompt_name=\"query\"" if resolved.retrieval.prompts.query else ""
    console.print(f"use it:\n  from sentence_transformers import {cls}\n  model = {cls}({str(run_dir / 'model')!r})\n"
                  f"  embeddings = model.encode([\"your query\"]{prompt})")
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def backbone(resolved: ResolvedConfig) -> str:
    """What sentence-transformers loads: the model id, or for a built-in tiny model a folder it is saved to
    (in the run folder: sentence-transformers loads models by name or path only)."""
    from leap_finetune.models.tiny import TINY_MODELS, build_tiny_model, load_tiny_tokenizer

    if resolved.model_id not in TINY_MODELS:
        return resolved.model_id
    folder = Path(resolved.run_dir) / "base_model"
    if not (folder / "config.json").exists():
        tokenizer = load_tiny_tokenizer(resolved.model_id)
        build_tiny_model(resolved.model_id, tokenizer).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return str(folder)


def several_workers() -> bool:
    """Several training processes (Ray Train workers): the losses gather every worker's documents, so each
    query is scored against the whole global batch, as on one device."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def set_prompts_and_length(model, resolved: ResolvedConfig, encoder_max: int | None) -> None:
    """The prompts travel with the saved model (encode(..., prompt_name="query")); the model reads texts up to
    the longer side's limit (each side was already cut to its own in the data step)."""
    prompts = resolved.retrieval.prompts
    saved = {k: v for k, v in (("query", prompts.query), ("document", prompts.document)) if v}
    if saved:
        model.prompts = {**(model.prompts or {}), **saved}
    if encoder_max:
        model.max_seq_length = encoder_max
