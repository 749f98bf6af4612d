"""What every recipe's worker does the same way: arguments, data from the run folder, model, callbacks, and the
train / evaluate / save sequence, read top-down in `train_evaluate_save`. Its parts stand on their own beside it:
the final model's saving (recipes/saving.py), the run's summary (recipes/summary.py), the sample answers
(recipes/samples.py), the errors a user can fix - a full disk, out of memory (recipes/failures.py)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from leap_finetune import faults, signals
from leap_finetune.config.communication import use_gradient_communication
from leap_finetune.config.own_keys import trainer_arguments
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.methods import method_of
from leap_finetune.quiet import quiet_libraries  # noqa: F401 - also imported from here
from leap_finetune.recipes.failures import disk_errors
from leap_finetune.recipes.ranks import is_main_process, rank
from leap_finetune.recipes.samples import print_samples
from leap_finetune.recipes.saving import full_state_dict, save_final_model
from leap_finetune.recipes.summary import (
    benchmark_summary,
    evaluation_summary,
    metrics_history,
    reward_summary,
    stopped_early,
    training_summary,
    write_summary,
)
from leap_finetune.runs.checkpoints import read_marker
from leap_finetune.runs.folder import RunFolder

if TYPE_CHECKING:  # (recipes/callbacks.py imports transformers' Trainer stack: ~1.3 s that validate never needs)
    from leap_finetune.recipes.callbacks import StopOnSignal


def _bf16_supported() -> bool:
    import torch

    return torch.cuda.is_bf16_supported()


def common_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    """The user's training_config (profile merged) plus what leap-finetune decides for every
    training type: precision, device, evaluation schedule, logging of real tokens."""
    detect = cuda is None  # (the driver passes it: no torch import, no CUDA context there)
    if detect:
        import torch

        cuda = torch.cuda.is_available()
    # (leap-finetune's own keys and model_init_kwargs are applied by leap-finetune, read from resolved.training: the
    # speed plan, the optimizer, the sampler, the DDP hook, the vision parts, the loader)
    args = trainer_arguments(resolved.training, method_of(resolved))
    if resolved.vision:
        args["remove_unused_columns"] = False  # the images' columns reach the collator
        # (the images are decoded and resized by the collator: on a GPU in the speed plan's data-loader workers,
        # recipes/speed.py; LFM2-VL-1.6B on an H200: 13.8k -> 18.6k tokens/s, the same losses)
        # a batch of rows without images leaves the vision encoder without gradients (several workers)
        args.setdefault("ddp_find_unused_parameters", True)
    args["output_dir"] = run_dir
    # bf16 where the hardware has it, float32 otherwise; an explicit bf16/fp16 key wins.
    # No CUDA on an Apple Silicon Mac: its GPU (mps), unless training_config says use_cpu (models/apple.py)
    mps = not cuda and not args.get("use_cpu") and _apple_gpu(detect)
    if "bf16" not in args and "fp16" not in args:
        # The driver passes `cuda` and must not create a CUDA context (it would hold memory on a GPU that a
        # server or another process uses): it assumes bf16 on a GPU; the training process checks.
        args["bf16"] = bool(cuda and (_bf16_supported() if detect else True)) or bool(
            mps and (_mps_bf16() if detect else True)
        )
        args["fp16"] = False
    args.setdefault("use_cpu", not cuda and not mps)
    if has_eval:
        args.setdefault("eval_strategy", "steps")
        # The baseline evaluation runs inside train(), after the model is wrapped for distributed training:
        # an evaluate() before train() leaves the model marked as prepared by accelerate, train() then skips
        # the DDP wrapper and every worker trains its own copy (measured on 2 workers: the losses left the
        # 1-worker run's at step 2). A resumed run has its baseline in metrics.jsonl already.
        args.setdefault("eval_on_start", not resolved.resume_checkpoint_path)
    else:
        args["eval_strategy"] = "no"
        args["eval_on_start"] = False
    # Checkpoint rotation is leap-finetune's (runs/checkpoints.py: a checkpoint is unmarked before
    # it is deleted); the Trainer's own would delete folders that are still marked complete.
    args["save_total_limit"] = None
    args.setdefault("disable_tqdm", True)
    args.setdefault("include_num_input_tokens_seen", "non_padding")
    # trackers name the run and its project as leap-finetune does (recipes/trackers.py)
    if resolved.run_name:
        args.setdefault("run_name", resolved.run_name)
    args.setdefault("project", resolved.project_name)
    return args


def _apple_gpu(detect: bool) -> bool:
    """The Mac's GPU: asked of PyTorch in the training process; the driver (no torch) goes by the machine."""
    from leap_finetune.models.apple import mps_available, on_apple_silicon

    return on_apple_silicon() and (mps_available() if detect else True)


def _mps_bf16() -> bool:
    from leap_finetune.models.apple import mps_bf16

    return mps_bf16()


@dataclass
class WorkerStart:
    """What every recipe's worker has once it starts: the run's config, its folder, the prepared rows and the
    trainer's arguments (built from the config as `validate` built them)."""

    resolved: ResolvedConfig
    run_dir: Path
    console: object  # a rich Console on stderr
    train_dataset: object
    eval_dataset: object | None
    args: object


def start_worker(resolved_json: dict, args_cls, training_arguments) -> WorkerStart:
    """The first steps of every recipe's `train`, in order: the config read back, the libraries' chatter quieted,
    the prepared rows loaded, the trainer's arguments built."""
    from rich.console import Console

    resolved = ResolvedConfig.model_validate(resolved_json)
    quiet_libraries()
    run_dir = Path(resolved.run_dir)
    train_dataset, eval_dataset = load_prepared(run_dir)
    args = args_cls(**training_arguments(resolved, run_dir=str(run_dir), has_eval=eval_dataset is not None))
    return WorkerStart(resolved, run_dir, Console(stderr=True), train_dataset, eval_dataset, args)


def load_prepared(run_dir: Path):
    from datasets import load_from_disk

    train = load_from_disk(str(RunFolder(run_dir).prepared_split("train")))
    eval_path = RunFolder(run_dir).prepared_split("eval")
    return train, (load_from_disk(str(eval_path)) if eval_path.exists() else None)


def load_tokenizer_and_model(resolved: ResolvedConfig, *, packing: bool, console):

    from leap_finetune.config.precision import keeps_bf16_weights
    from leap_finetune.data.chat_templates import load_chat_template
    from leap_finetune.models.loading import load_model, load_tokenizer
    from leap_finetune.models.packed_conv import enable_exact_packing
    from leap_finetune.models.varlen_attention import use_varlen_attention

    faults.point("model-loading")
    init = resolved.training.get("model_init_kwargs") or {}
    if keeps_bf16_weights(resolved.training.get("optimizer_precision")) and "dtype" not in init:
        init = {**init, "dtype": "bfloat16"}  # (its optimizer keeps bf16 updates exact: recipes/optimizers.py)
    tokenizer = load_tokenizer(resolved.model_id, init)
    # The official chat template travels with the trained model.
    tokenizer.chat_template = load_chat_template(resolved.chat_template, tokenizer).text
    conv = enable_exact_packing() if packing else None
    # float32 master weights with bf16 autocast by default; `model_init_kwargs: {dtype: bfloat16}` keeps
    # the weights (and optimizer states) in bf16: faster and half the memory, less precise updates.
    model = load_model(resolved.model_id, tokenizer, init)
    model.config.use_cache = False
    from leap_finetune.models.moe_router import attach_from_training

    routers = attach_from_training(model, resolved.training)
    if routers:
        console.print(routers)
    if packing:
        attention = use_varlen_attention(model) or f"{model.config._attn_implementation} over position ids"
        console.print(f"packing: documents kept apart by {attention} (attention) and {conv} (LFM2 convolutions)")
    return tokenizer, model


def with_adapter(resolved: ResolvedConfig, model):
    """adapter_path: the model with that LoRA adapter loaded, to be trained further."""
    if resolved.adapter_path is None:
        return model
    from peft import PeftModel

    return PeftModel.from_pretrained(model, resolved.adapter_path, is_trainable=True)


def adapter_reference(trainer, resolved: ResolvedConfig) -> None:
    """adapter_path in DPO, KTO and GRPO (with a KL term): TRL's reference for a model that arrives with an adapter
    is the base plus a frozen copy of that adapter (its "ref" adapter: the step starts from the adapter's own
    answers, without a second copy of the base). `reference_adapter: false` drops the copy: the reference is then
    the base with the adapter switched off."""
    if resolved.adapter_path is None or resolved.training.get("reference_adapter") is not False:
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    if "ref" in getattr(model, "peft_config", {}):
        model.delete_adapter("ref")
        model.set_adapter("default")


def lora_config(resolved: ResolvedConfig):
    if resolved.peft is None or resolved.adapter_path is not None:  # (adapter_path: the adapter is loaded itself)
        return None
    from peft import LoraConfig

    from leap_finetune.models.architectures import peft_options
    from leap_finetune.models.registry import model_type

    options = peft_options(resolved.peft, model_type(resolved.model_id))
    if resolved.vision:  # the vision encoder / projector trained in full next to the adapters, when asked
        from leap_finetune.recipes.vision import lora_modules_to_save

        extra = lora_modules_to_save(resolved.training)
        if extra:
            options["modules_to_save"] = list(dict.fromkeys([*(options.get("modules_to_save") or []), *extra]))
    return LoraConfig(task_type="CAUSAL_LM", **options)


def standard_callbacks(
    resolved: ResolvedConfig, run_dir: Path, console, stop_on_signal: StopOnSignal, extra: list | None, benchmarks=None
) -> list:
    from leap_finetune.recipes.callbacks import (
        CheckpointMarker,
        FinishOnly,
        MetricsLog,
        ResumeChanges,
        RichProgress,
        RouterMetrics,
    )
    from leap_finetune.recipes.plots import Plots

    resumed = read_marker(Path(resolved.resume_checkpoint_path)) if resolved.resume_checkpoint_path else None
    marker = CheckpointMarker(
        run_dir,
        resolved.training.get("save_total_limit"),
        seconds_before=(resumed or {}).get("trained_seconds", 0.0),
        record={"config": resolved.to_json_dict(), "data": _fingerprint(run_dir)},
    )
    from leap_finetune.recipes.trackers import TrackerConfig, tracker_environment

    tracker_environment(resolved)

    # (Plots after MetricsLog: the last log of the run is in metrics.jsonl when the plots are drawn)
    callbacks = [
        FinishOnly(),
        ResumeChanges(resolved.resume_changes),
        RouterMetrics(),  # (before MetricsLog: it adds the router metrics to the log MetricsLog writes)
        MetricsLog(RunFolder(run_dir).metrics),
        marker,
        RichProgress(console),
        stop_on_signal,
        Plots(run_dir, console),
        TrackerConfig(resolved, console),
    ]
    if os.environ.get("LEAP_FINETUNE_PROFILE"):  # a developer's tool for the benchmarks (recipes/profiling.py)
        from leap_finetune.recipes.profiling import StepProfile

        callbacks.append(StepProfile(Path(os.environ["LEAP_FINETUNE_PROFILE"])))
    return callbacks + ([benchmarks] if benchmarks is not None else []) + list(extra or [])


def _fingerprint(run_dir: Path) -> dict | None:
    try:
        return json.loads(RunFolder(run_dir).fingerprint.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def benchmark_callback(resolved: ResolvedConfig, tokenizer, run_dir: Path, console):
    """The `evals:` block as a callback (None without one). Benchmarks were validated by the driver."""
    if resolved.evals is None:
        return None
    from leap_finetune.data.chat_templates import load_chat_template
    from leap_finetune.data.render import Renderer
    from leap_finetune.evaluation.callback import BenchmarkCallback
    from leap_finetune.evaluation.runner import has_images, load_benchmarks
    from leap_finetune.models.vision import is_vision_model, load_processor

    template = load_chat_template(resolved.chat_template, tokenizer)
    from leap_finetune.config.rules import benchmark_every, best_benchmark

    every = benchmark_every(resolved.evals, resolved.training)
    if resolved.async_eval is not None and resolved.async_eval.mode != "sync":
        from leap_finetune.evaluation.async_eval import AsyncBenchmarks

        return AsyncBenchmarks(resolved, run_dir, console, every, template.text)
    renderer = Renderer(tokenizer, template, "all", None)
    vision = is_vision_model(resolved.model_id)
    benchmarks = load_benchmarks(
        resolved.evals, vision=vision, model_name=resolved.model_name, environment=resolved.environment
    )
    settings = resolved.image_processor.settings() if resolved.image_processor is not None else None
    processor = load_processor(resolved.model_id, tokenizer, settings) if vision and has_images(benchmarks) else None
    max_failures = resolved.async_eval.failure.max_consecutive if resolved.async_eval else 3
    callback = BenchmarkCallback(
        resolved.evals, benchmarks, renderer, run_dir, console, every, processor=processor, max_failures=max_failures
    )
    callback.best = best_benchmark(resolved.training)  # (metric_for_best_model on a benchmark's score)
    return callback


def train_evaluate_save(
    trainer,
    resolved: ResolvedConfig,
    run_dir: Path,
    tokenizer,
    console,
    stop_on_signal: StopOnSignal,
    samples: list[dict],
    after_training=None,
) -> dict:
    """Baseline eval -> train (resuming if planned) -> final eval -> save model (+ adapter) -> summary.
    `after_training(trainer) -> dict`: called on every rank right after training (it may be a collective); what
    it returns goes into the summary. A full disk is an error that says so (recipes/failures.py)."""
    with disk_errors(run_dir, trainer, resolved.training):
        _quantization_aware(trainer, resolved, console)
        benchmarks = _take_over_output(trainer, console)
        resume = resolved.resume_checkpoint_path
        baseline_benchmarks = benchmarks.evaluate("before training") if benchmarks is not None and not resume else {}
        result = _train(trainer, resolved, benchmarks)
        extra = after_training(trainer) if after_training is not None else {}
        if not is_main_process():
            return _beside_rank_0(trainer)
        # The whole run, also after resumes: after a resume the Trainer's loss covers only this process's
        # steps, so it is averaged over every logged step of metrics.jsonl instead; training time is summed
        # over the processes.
        history = metrics_history(RunFolder(run_dir).metrics)
        train_loss = (
            history["train_loss"]
            if (resume or result is None) and history["train_loss"] is not None
            else (result.training_loss if result is not None else None)
        )
        summary = training_summary(trainer, train_loss, extra)
        if resolved.predicted_gpu_memory and "peak_gpu_memory_gib" in summary:  # (docs/memory.md)
            summary["predicted_gpu_memory_gib"] = round(resolved.predicted_gpu_memory / 2**30, 2)
        summary.update(reward_summary(history["rewards"]))
        from leap_finetune.recipes.plots import Plots

        plots = next(c for c in trainer.callback_handler.callbacks if isinstance(c, Plots))
        if trainer.state.global_step < trainer.state.max_steps:
            if benchmarks is not None:
                benchmarks.finish(wait=False)  # async modes: evaluations still running are stopped
            plots.draw_in_background(trainer.is_world_process_zero())
            return stopped_early(run_dir, summary, stop_on_signal, plots)
        if resume:
            baseline_benchmarks = history["initial_benchmarks"]
        summary.update(_evaluate_at_the_end(trainer, benchmarks, baseline_benchmarks, resume, history))
        plots.draw_in_background(trainer.is_world_process_zero())  # every evaluation is logged by now
        final_model, saved = save_final_model(trainer, resolved, run_dir, tokenizer, console)
        summary.update(saved)
        if samples and not getattr(trainer, "is_fsdp_enabled", False):  # a sharded model generates on every rank only
            reader = getattr(trainer.data_collator, "reader", None)  # (an image run's collator: its processor)
            processor = reader.processor if reader else None
            print_samples(console, "after training", final_model, tokenizer, samples, processor)
        plots.wait()
        write_summary(run_dir, summary, finished=True)
        return summary


def _quantization_aware(trainer, resolved: ResolvedConfig, console) -> None:
    """qat: the model's linear layers (LoRA layers merged) run through the target's rounding (models/qat.py),
    from qat.start_step on; evaluations at those steps measure the quantized model."""
    if not resolved.qat:
        return
    from leap_finetune.models import qat
    from leap_finetune.recipes.callbacks import QatSwitch

    state, patched = qat.apply(trainer.model, resolved.qat["target"], resolved.qat["start_step"])
    trainer.add_callback(QatSwitch(state))
    start = resolved.qat["start_step"]
    console.print(
        f"quantization-aware training: {patched} linear layers through {qat.TARGETS[state.target][1]}"
        + (f", from step {start}" if start else "")
        + f"; export with --gguf {state.target}"
    )


def _take_over_output(trainer, console):
    """transformers' own progress and printing give way to leap-finetune's callbacks; the benchmarks callback learns
    its trainer. Rank 0 says what trains. Returns the benchmarks to run here: rank 0's (once, not once per rank),
    None on the other ranks or without `evals:`."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from leap_finetune.evaluation.callback import EvaluationLog

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    benchmarks = next((c for c in trainer.callback_handler.callbacks if isinstance(c, EvaluationLog)), None)
    if benchmarks is not None:
        benchmarks.trainer = trainer
    if not is_main_process():
        return None
    _print_model_summary(console, trainer.model)
    if getattr(trainer, "is_fsdp_enabled", False):
        console.print(
            f"fsdp: the model is sharded over {trainer.accelerator.num_processes} workers "
            "(the final model is gathered on rank 0 to be saved)"
        )
    return benchmarks


def _train(trainer, resolved: ResolvedConfig, benchmarks):
    try:
        return train_or_finish(
            trainer, resolved.resume_checkpoint_path, resolved.training.get("gradient_communication")
        )
    except BaseException:
        if benchmarks is not None:  # async modes: no job or server outlives a crashed run
            benchmarks.finish(wait=False)
        raise


def _beside_rank_0(trainer) -> dict:
    """A rank other than 0 at the end of training: it takes part in the collectives of rank 0's end (the
    distributed last evaluation, FSDP's gathering of the weights) and writes nothing."""
    if trainer.state.global_step >= trainer.state.max_steps:
        if trainer.eval_dataset is not None:
            _final_eval(trainer)  # the last evaluation is distributed too
        full_state_dict(trainer)  # FSDP: every rank takes part in gathering the weights
    return {"global_step": trainer.state.global_step, "rank": rank()}


def _evaluate_at_the_end(trainer, benchmarks, baseline_benchmarks: dict, resume, history: dict) -> dict:
    """The last step's evaluation and benchmarks, with those of step 0, as the summary records them."""
    has_eval = trainer.eval_dataset is not None  # the baseline evaluation is logged at step 0 (eval_on_start)
    summary = {}
    if benchmarks is not None:
        final = benchmarks.evaluate("after training")  # (async modes: the snapshot is handed over)
    if has_eval:  # before waiting for async evaluations: the other ranks are in this collective evaluation
        last = _final_eval(trainer)
    if benchmarks is not None:
        finished = benchmarks.finish(wait=True)  # async modes: every evaluation's results, by training step
        if finished is not None:
            final = finished.get(trainer.state.global_step, {})
            if not resume:  # (resumed: the step-0 results were logged by the first process, read above)
                baseline_benchmarks = finished.get(0, {})
        summary.update(benchmark_summary(final, baseline_benchmarks))
    if has_eval:
        summary.update(evaluation_summary(last, history["initial_eval"] or None))
    return summary


def train_or_finish(trainer, resume: str | None, gradient_communication: str | None = None):
    """trainer.train(), or - resumed from the run's last step - nothing to train: the checkpoint is loaded (its
    weights, optimizer, scheduler and state), and the end of training is done as transformers does it (the
    callbacks' on_train_end, the best model loaded where asked). Returns TrainOutput, or None when nothing was
    trained. `gradient_communication`: the training_config key (config/communication.py)."""
    from leap_finetune.recipes.callbacks import AlreadyTrained

    signals.leave_signals_to_the_training_process()  # (data-loader workers: a stop signal is the trainer's)
    use_gradient_communication(trainer, gradient_communication)
    try:
        return trainer.train(resume_from_checkpoint=resume)
    except AlreadyTrained:
        trainer.is_in_train = False
        trainer.control = trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
        if trainer.args.load_best_model_at_end and trainer.state.best_model_checkpoint is not None:
            trainer._load_best_model()
        return None


def _final_eval(trainer) -> dict:
    """The evaluation at the last step (run now unless the schedule already ran it there)."""
    last = next((e for e in reversed(trainer.state.log_history) if "eval_loss" in e), None)
    if last is None or last.get("step") != trainer.state.global_step:
        last = trainer.evaluate()
    return last


def _print_model_summary(console, model) -> None:
    total = sum(_weights_in(p) for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    console.print(f"model: {total:,} parameters, {trainable:,} trainable ({100 * trainable / total:.2f}%)")
    quantized = [m for m in model.modules() if type(m).__module__.startswith("bitsandbytes.")]  # (not peft's wrappers)
    if quantized:  # (QLoRA: what bitsandbytes actually quantized as the model loaded, not what the config asked)
        kind = getattr(getattr(quantized[0].weight, "quant_state", None), "quant_type", None) or "int8"
        console.print(f"quantized base: {len(quantized)} linear layers in {kind} (bitsandbytes), the rest unquantized")


def _weights_in(parameter) -> int:
    """A parameter's weights; a 4-bit one is stored packed (two weights a byte), its shape kept in its quant_state."""
    state = getattr(parameter, "quant_state", None)
    return state.shape.numel() if state is not None else parameter.numel()
