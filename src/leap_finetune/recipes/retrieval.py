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
from leap_finetune.methods import method_of
from leap_finetune.models.encoders import backbone
from leap_finetune.recipes import common, speed
from leap_finetune.recipes.failures import disk_errors
from leap_finetune.recipes.host_syncs import PendingTokensSeen
from leap_finetune.recipes.plots import Plots
from leap_finetune.recipes.ranks import is_main_process
from leap_finetune.recipes.saving import save_atomic
from leap_finetune.recipes.summary import metrics_history, stopped_early, training_summary, write_summary
from leap_finetune.runs.folder import RunFolder

EVAL_NAME = "retrieval"  # metrics are logged as eval_retrieval_<score>_ndcg@10, ...


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    evals = resolved.evals  # retrieval benchmarks: scored with the held-out rows, on the same schedule
    args = common.common_arguments(resolved, run_dir=run_dir, has_eval=has_eval or evals is not None, cuda=cuda)
    fast = speed_plan(resolved, cuda)
    speed.apply_trainer_defaults(args, fast)
    args.pop("pad_to_multiple_of", None)  # (flat rows pad themselves: models/flat_rows.py)
    # (on a GPU the plan's data-loader workers matter most here: sentence-transformers tokenizes each batch in its
    # collator, ~50 ms for 64 pairs of ~250 tokens on one core, a third of an H200 step of LFM2-350M)
    if evals is not None and evals.eval_steps:
        args["eval_steps"] = evals.eval_steps
    prompts = resolved.retrieval.prompts if resolved.retrieval is not None else None
    if prompts is not None and (prompts.query or prompts.document):
        # column -> prompt; sentence-transformers puts it before each text (and counts it in pooling)
        columns = {"query": prompts.query, "positive": prompts.document}
        columns.update({f"negative_{i}": prompts.document for i in range(1, 65)})
        args["prompts"] = {k: v for k, v in columns.items() if v}
    if several_workers():
        # one batch of per_device x workers rows is drawn and split among the workers: see leap_trainer
        args["accelerator_config"] = {**(args.get("accelerator_config") or {}), "split_batches": True}
    return args


def speed_plan(resolved: ResolvedConfig, cuda: bool | None = None) -> speed.SpeedPlan:
    """The encoder's LFM2 backbone as SFT's decoder: padded batches run as one flat row (models/flat_rows.py: the
    same embeddings as the padded batch), each layer compiled, no host sync inside a step."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return speed.plan(resolved.training, resolved.model_id, cuda, lora=resolved.peft is not None)


def use_speed_plan(model, resolved: ResolvedConfig, console) -> speed.SpeedPlan:
    """Apply the plan to a sentence-transformers model's LFM2 backbone; returns it (what was applied)."""
    from leap_finetune.models import flat_rows
    from leap_finetune.models.packed_conv import enable_exact_packing
    from leap_finetune.models.varlen_attention import use_varlen_attention

    fast = speed_plan(resolved)
    encoder = model.transformers_model
    line = fast.line
    # ColBERT's query expansion scores positions its attention mask marks as padding: those must stay in place
    expansion = any(getattr(m, "query_expansion", None) is not None for m in model.modules())
    flat = fast.padding_free and not expansion and use_varlen_attention(encoder) is not None
    if flat and flat_rows.enable(encoder, from_mask=True, multiple=speed.PAD_TO_MULTIPLE_OF):
        enable_exact_packing()
        _quiet_per_column_note()
    elif fast.padding_free:
        flat = False
        reason = "query expansion" if expansion else "not an LFM2 backbone"
        line = line.replace("padding-free batches", f"padded batches ({reason})")
    if fast.compile_layers:
        speed.compile_layers(encoder)
    if is_main_process():
        console.print(line)
    return speed.SpeedPlan(flat, fast.compile_layers, line, fast.trainer_defaults)


def _quiet_per_column_note() -> None:
    """sentence-transformers notes once that it embeds each text column in its own forward "because the columns
    disagree on 'flat_rows'" and that combining them "is faster": here each column's layout is its own on purpose
    (each column runs as one flat row without padding; measured 2.9x / 2.0x its own trainer, bench/RESULTS.md), so
    the note would mislead. Only that note is dropped."""
    import logging

    class DropNote(logging.Filter):
        def filter(self, record):
            return "disagree on 'flat_rows'" not in record.getMessage()

    logger = logging.getLogger("sentence_transformers.base.losses.merged_forward")
    if not any(type(f).__name__ == "DropNote" for f in logger.filters):
        logger.addFilter(DropNote())


def leap_trainer(trainer_cls):
    """The sentence-transformers trainer with two additions.

    Several workers: each batch is drawn for all workers at once. Left as it is, every worker draws its own
    no-duplicates batch; with the documents gathered across workers, the same text could then be one query's
    positive on one worker and its "negative" from another (data with repeated rows). Here the sampler draws
    per_device x workers rows with no duplicate text and accelerate's split_batches gives each worker its slice,
    so 2 workers x N rows train exactly like 1 worker x 2N rows (tests/e2e). accelerate skips a short batch in
    the middle of an epoch (the sampler makes one when the remaining rows repeat texts) and completes the last
    one: FullBatches completes every short batch with rows of the epoch's first batch instead, so that no row is
    dropped (a few rows are seen twice in such an epoch).

    LoRA: a checkpoint holds the adapted layers' weights (base_layer, lora_A/B), which sentence-transformers'
    resume (a plain model built from the checkpoint) cannot load; they are loaded into the model as it is.
    """
    several = several_workers()

    class LeapRetrievalTrainer(PendingTokensSeen, trainer_cls):
        # sentence-transformers builds its train and eval loaders through this method (pinned range, tests/e2e)
        def _build_dataloader(self, dataset, batch_size, dataset_kind):
            if several:
                batch_size *= self.accelerator.num_processes
            return super()._build_dataloader(dataset, batch_size, dataset_kind)

        def get_batch_sampler(self, dataset, batch_size, *args, **kwargs):
            sampler = super().get_batch_sampler(dataset, batch_size, *args, **kwargs)
            return FullBatches(sampler, batch_size) if several and sampler is not None else sampler

        def get_train_dataloader(self):
            if not several or self.train_dataset is None:
                return super().get_train_dataloader()
            self.accelerator.even_batches = True
            self._train_dataloader = self.accelerator.prepare(
                self._build_dataloader(self.train_dataset, self.args.train_batch_size, dataset_kind="train")
            )
            return self._train_dataloader

        def _track_num_input_tokens(self, inputs):
            # sentence-transformers' batches hold one `<column>_input_ids` per text column and no `input_ids`:
            # every column's tokens are counted (the Trainer's own count finds none; pinned range, tests/e2e),
            # on the device until a log or checkpoint reads them (recipes/host_syncs.py)
            mode = self.args.include_num_input_tokens_seen
            if mode in ("no", False):
                return
            suffix = "_attention_mask" if mode == "non_padding" else "_input_ids"
            for key, value in inputs.items():
                if key.endswith(suffix) and hasattr(value, "numel"):
                    if suffix == "_attention_mask":
                        self._add_input_tokens(value.sum())
                    else:
                        self._add_input_tokens(value.numel())

        def _load_from_checkpoint(self, checkpoint_path):
            if getattr(self.model.transformers_model, "leap_lora_config", None) is None:
                return super()._load_from_checkpoint(checkpoint_path)
            load_lora_checkpoint(self.model, Path(checkpoint_path))

    LeapRetrievalTrainer.__name__ = trainer_cls.__name__
    return LeapRetrievalTrainer


class FullBatches:
    """A batch sampler whose batches all have batch_size rows: a short one is completed with rows of the
    epoch's first batch (see leap_trainer)."""

    def __init__(self, sampler, batch_size: int):
        self.sampler, self.batch_size = sampler, batch_size
        self.drop_last = getattr(sampler, "drop_last", False)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        first: list[int] = []
        for batch in self.sampler:
            batch = list(batch)
            if not first:
                first = batch
            if len(batch) < self.batch_size:
                extra = [i for i in first if i not in batch] or first
                while len(batch) < self.batch_size:
                    batch += extra[: self.batch_size - len(batch)]
            yield batch

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


def load_lora_checkpoint(model, checkpoint: Path) -> None:
    """Every weight file of a LoRA run's checkpoint (one per module folder of modules.json) into the model as
    it is, strictly: a key that does not match is an error, not a silently fresh layer."""
    from safetensors.torch import load_file

    own = model.state_dict()
    loaded = {}
    for entry in json.loads((checkpoint / "modules.json").read_text()):
        prefix = f"{entry['idx']}."
        names = [k for k in own if k.startswith(prefix)]
        for file in sorted((checkpoint / entry["path"]).glob("*.safetensors")):
            for key, value in load_file(str(file)).items():
                match = [k for k in names if k == prefix + key or k.endswith("." + key)]
                if len(match) != 1:
                    raise RuntimeError(
                        f"checkpoint {checkpoint}: weight {key} of {file.name} matches "
                        f"{len(match)} parameters of the model"
                    )
                loaded[match[0]] = value
    model.load_state_dict(loaded, strict=True)


def evaluator(resolved: ResolvedConfig, train, eval_rows, multi_vector: bool):
    """The held-out queries over every document of the data (train and held-out positives and negatives), each
    held-out query's positive the relevant one; then each retrieval benchmark of `evals:` (its own metrics)."""
    from leap_finetune.evaluation.retrieval_benchmark import (
        evaluator as benchmark_evaluator,
    )
    from leap_finetune.evaluation.retrieval_benchmark import ir_evaluator

    prompts = resolved.retrieval.prompts
    evaluators = []
    if eval_rows is not None:
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
        evaluators.append(ir_evaluator(EVAL_NAME, queries, corpus, relevant, prompts, multi_vector=multi_vector))
    for bench in retrieval_benchmarks(resolved):
        evaluators.append(benchmark_evaluator(bench, prompts, multi_vector=multi_vector))
    if len(evaluators) <= 1:
        return evaluators[0] if evaluators else None
    from sentence_transformers.evaluation import SequentialEvaluator

    return SequentialEvaluator(evaluators)


def retrieval_benchmarks(resolved: ResolvedConfig) -> list:
    if resolved.evals is None:
        return []
    from leap_finetune.evaluation.retrieval_benchmark import load_retrieval_benchmark

    return [load_retrieval_benchmark(bench) for bench in resolved.evals.benchmarks]


def main_score(metrics: dict) -> tuple[str, float] | None:
    """The held-out nDCG@10, whatever the score function is called (cosine, maxsim, ...)."""
    for key, value in metrics.items():
        if key.startswith(f"eval_{EVAL_NAME}_") and key.endswith("_ndcg@10"):
            return key, float(value)
    return None


def train(
    resolved_json: dict,
    *,
    model_factory,
    loss_factory,
    trainer_cls,
    args_cls,
    multi_vector: bool,
    callbacks: list | None = None,
) -> dict:
    """The embedding and ColBERT worker: model -> trainer -> train -> evaluate (every rank) -> save, summary (rank 0)."""
    with disk_errors(Path(resolved_json["run_dir"]), training=resolved_json.get("training")):
        start = common.start_worker(resolved_json, args_cls, training_arguments)
        resolved, run_dir, console = start.resolved, start.run_dir, start.console
        from transformers import set_seed

        set_seed(start.args.seed)  # new layers (a pooling projection, LoRA) start the same in every run of this config
        model = model_factory(resolved, console)
        fast = use_speed_plan(model, resolved, console)
        if resolved.peft is not None:
            add_lora(model, resolved, console)
        from leap_finetune.recipes.callbacks import StopOnSignal

        stop_on_signal = StopOnSignal()
        callbacks = common.standard_callbacks(
            resolved,
            run_dir,
            console,
            stop_on_signal,
            speed.with_compile_phase(callbacks, console, fast.compile_layers),
        )
        trainer = _trainer(start, model, fast, loss_factory(resolved, model), trainer_cls, multi_vector, callbacks)
        resume = resolved.resume_checkpoint_path
        result = common.train_or_finish(trainer, resume, resolved.training.get("gradient_communication"))
        finished = trainer.state.global_step >= trainer.state.max_steps
        # every rank evaluates (the evaluation loss is gathered over the workers)
        has_eval = start.eval_dataset is not None or resolved.evals is not None
        final = trainer.evaluate() if finished and has_eval else None
        if not is_main_process():
            return {"global_step": trainer.state.global_step}
        history = metrics_history(RunFolder(run_dir).metrics)
        # (fewer steps than logging_steps log no loss: the Trainer's own mean then)
        loss = history["train_loss"] if history["train_loss"] is not None or result is None else result.training_loss
        summary = training_summary(trainer, loss)
        plots = next(c for c in trainer.callback_handler.callbacks if isinstance(c, Plots))
        plots.draw_in_background(True)  # every evaluation is logged by now; drawn beside the saving below
        if not finished:
            return stopped_early(run_dir, summary, stop_on_signal, plots)
        if final is not None:
            summary.update(_evaluation_summary(resolved, final, history["initial_eval"]))
        summary.update(_save(model, resolved, run_dir))
        cls = "MultiVectorEncoder" if multi_vector else "SentenceTransformer"
        prompt = ', prompt_name="query"' if resolved.retrieval.prompts.query else ""
        console.print(
            f"use it:\n  from sentence_transformers import {cls}\n  model = {cls}({str(RunFolder(run_dir).model)!r})\n"
            f'  embeddings = model.encode(["your query"]{prompt})'
        )
        plots.wait()
        write_summary(run_dir, summary, finished=True)
        return summary


def _trainer(start, model, fast: speed.SpeedPlan, loss, trainer_cls, multi_vector: bool, callbacks: list):
    """sentence-transformers' trainer (leap_trainer's additions) on the prepared rows, the held-out ones scored by
    the retrieval evaluator; flat batches through the plan's collator; leap-finetune's progress in place of its own."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from leap_finetune.models import flat_rows

    resolved, train_dataset, eval_dataset = start.resolved, start.train_dataset, start.eval_dataset
    trainer = leap_trainer(trainer_cls)(
        model=model,
        args=start.args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset.select_columns(["query", "positive"]) if eval_dataset is not None else None,
        loss=loss,
        evaluator=evaluator(resolved, train_dataset, eval_dataset, multi_vector),
        callbacks=callbacks,
    )
    if fast.padding_free:
        trainer.data_collator = flat_rows.ColumnsCollator(trainer.data_collator, speed.PAD_TO_MULTIPLE_OF)
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    return trainer


def _evaluation_summary(resolved: ResolvedConfig, final: dict, initial: dict) -> dict:
    """The last evaluation and the step-0 one: every metric, the held-out loss and nDCG@10, each benchmark's."""
    summary = {"eval_metrics": {k: float(v) for k, v in final.items() if isinstance(v, (int, float))}}
    if initial:
        summary["initial_eval_metrics"] = {k: float(v) for k, v in initial.items() if isinstance(v, (int, float))}
    if "eval_loss" in final:  # (the held-out rows' in-batch loss; benchmarks alone give none)
        summary["eval_loss"] = float(final["eval_loss"])
        summary["initial_eval_loss"] = initial.get("eval_loss")
    score = main_score(final)
    if score is not None:
        summary["ndcg@10"] = score[1]
        first = main_score(initial)
        summary["initial_ndcg@10"] = first[1] if first else None
    benchmarks = [b.name for b in resolved.evals.benchmarks] if resolved.evals is not None else []
    if benchmarks:
        from leap_finetune.evaluation.retrieval_benchmark import scores

        summary["retrieval_benchmarks"] = {
            name: scores(final, f"benchmark_{name}").get("ndcg@10") for name in benchmarks
        }
        summary["initial_retrieval_benchmarks"] = {
            name: scores(initial, f"benchmark_{name}").get("ndcg@10") for name in benchmarks
        }
    return summary


def _save(model, resolved: ResolvedConfig, run_dir: Path) -> dict:
    """model/ (and, for LoRA, the backbone's adapter on its own in peft's format, then the model with it merged: a
    sentence-transformers folder that loads without peft); the summary's entries naming them."""
    saved = {}
    if resolved.peft is not None:
        save_atomic(RunFolder(run_dir).adapter, lambda path: save_adapter(model, resolved, path))
        saved["adapter_dir"] = str(RunFolder(run_dir).adapter)
        merge_lora(model)
    save_atomic(RunFolder(run_dir).model, lambda path: model.save_pretrained(str(path)))
    saved["model_dir"] = str(RunFolder(run_dir).model)
    return saved


def load_encoder(folder: Path, run_config: dict | None, training_type: str):
    """(model, merged) for `export`: a sentence-transformers folder as it is, or a LoRA run's checkpoint-N
    rebuilt as its run built the model (backbone, pooling or projection, prompts), the checkpoint's weights
    loaded and the adapter merged."""
    from rich.console import Console

    from leap_finetune.errors import LeapError
    from leap_finetune.models.trained import unmerged_lora

    if not unmerged_lora(folder):
        from sentence_transformers import MultiVectorEncoder, SentenceTransformer

        cls = MultiVectorEncoder if method_of(training_type).multi_vector else SentenceTransformer
        return cls(str(folder), device="cpu"), False
    if run_config is None:
        raise LeapError(
            "a checkpoint of a LoRA retrieval run, without its run's resolved_config.yaml beside it "
            "(needed to rebuild the model the adapter belongs to)",
            where=str(folder),
            fix="export the checkpoint from inside its run folder (outputs/PROJECT/RUN/checkpoint-N)",
        )
    import logging

    from leap_finetune.models.encoders import build_encoder

    resolved = ResolvedConfig.model_validate(run_config)
    quiet = Console(quiet=True)
    # (sentence-transformers' notice that it converts the backbone, as when the run started: no news here)
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    model = build_encoder(resolved, quiet)
    add_lora(model, resolved, quiet)
    load_lora_checkpoint(model, folder)
    merge_lora(model)
    return model, True


def add_lora(model, resolved: ResolvedConfig, console) -> None:
    """LoRA layers put into the transformer backbone with peft (its other modules - a ColBERT projection, a
    Dense layer - stay fully trainable). Not sentence-transformers' add_adapter: that goes through transformers'
    peft integration, which needs peft >= 0.22, newer than the peft this release is tested with."""
    from peft import LoraConfig, inject_adapter_in_model

    from leap_finetune.models.architectures import peft_options
    from leap_finetune.models.registry import model_type

    config = LoraConfig(task_type="FEATURE_EXTRACTION", **peft_options(resolved.peft, model_type(resolved.model_id)))
    inject_adapter_in_model(config, model.transformers_model)
    model.transformers_model.leap_lora_config = config
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    if is_main_process():
        console.print(f"lora: {trainable:,} of {total:,} parameters train ({100 * trainable / total:.2f}%)")


def save_adapter(model, resolved: ResolvedConfig, folder: Path) -> None:
    """The backbone's LoRA weights in peft's format (PeftModel.from_pretrained(AutoModel...(base), folder))."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = Path(folder)
    adapted = model.transformers_model
    config = adapted.leap_lora_config
    # a built-in tiny backbone is the run's base_model/ folder (its name resolves nowhere else)
    config.base_model_name_or_path = backbone(resolved)
    config.save_pretrained(str(folder))
    weights = get_peft_model_state_dict(adapted)
    # named as PeftModel.save_pretrained names them (the backbone is PeftModel's base_model.model)
    save_file(
        {f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in weights.items()},
        str(folder / "adapter_model.safetensors"),
    )


def merge_lora(model) -> None:
    """The LoRA weights merged into the backbone's layers, in place: peft's layers merge, then the base layer
    takes the adapted layer's place, so the model saves and loads without peft."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    backbone = model.transformers_model
    for name, module in list(backbone.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(backbone.get_submodule(parent) if parent else backbone, child, module.get_base_layer())
    del backbone.leap_lora_config
    for parameter in backbone.parameters():
        parameter.requires_grad_(True)


def loss_options(settings) -> dict:
    """The `retrieval:` block's settings every loss takes: the temperature (as sentence-transformers' scale) and
    whether the negatives are gathered across devices (default: with several workers)."""
    options = {
        "gather_across_devices": several_workers()
        if settings.gather_across_devices is None
        else bool(settings.gather_across_devices and several_workers())
    }
    if settings.temperature is not None:
        options["scale"] = 1.0 / settings.temperature
    return options


def several_workers() -> bool:
    """Several training processes (Ray Train workers): the losses gather every worker's documents, so each
    query is scored against the whole global batch, as on one device."""
    import os

    return int(os.environ.get("WORLD_SIZE", "1")) > 1
