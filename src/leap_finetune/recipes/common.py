"""What every recipe's worker does the same way: arguments, data from the run folder, model,
callbacks, the train / evaluate / save sequence, and the sample answers."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from leap_finetune import faults, signals
from leap_finetune.config.communication import gradient_all_reduce, use_gradient_communication
from leap_finetune.config.own_keys import trainer_arguments
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.files import write_atomic
from leap_finetune.methods import method_of
from leap_finetune.quiet import quiet_libraries  # noqa: F401 - also imported from here
from leap_finetune.recipes.callbacks import (
    AlreadyTrained,
    CheckpointMarker,
    FinishOnly,
    MetricsLog,
    ResumeChanges,
    RichProgress,
    StopOnSignal,
)
from leap_finetune.runs.checkpoints import read_marker
from leap_finetune.runs.folder import RunFolder


def is_main_process() -> bool:
    """Rank 0 of a distributed run (Ray Train sets RANK), or the only process: it alone writes the run
    folder's files, runs the benchmarks and prints samples."""
    return int(os.environ.get("RANK", "0")) == 0


def common_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    """The user's training_config (profile merged) plus what leap-finetune decides for every
    training type: precision, device, evaluation schedule, logging of real tokens."""
    import torch

    detect = cuda is None
    if detect:
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
    if "bf16" not in args and "fp16" not in args:
        # The driver passes `cuda` and must not create a CUDA context (it would hold memory on a GPU that a
        # server or another process uses): it assumes bf16 on a GPU; the training process checks.
        args["bf16"] = bool(cuda and (torch.cuda.is_bf16_supported() if detect else True))
        args["fp16"] = False
    args.setdefault("use_cpu", not cuda)
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
    if packing:
        attention = use_varlen_attention(model) or f"{model.config._attn_implementation} over position ids"
        console.print(f"packing: documents kept apart by {attention} (attention) and {conv} (LFM2 convolutions)")
    return tokenizer, model


def lora_config(resolved: ResolvedConfig):
    if resolved.peft is None:
        return None
    from peft import LoraConfig

    options = dict(resolved.peft)
    if resolved.vision:  # the vision encoder / projector trained in full next to the adapters, when asked
        from leap_finetune.recipes.vision import lora_modules_to_save

        extra = lora_modules_to_save(resolved.training)
        if extra:
            options["modules_to_save"] = list(dict.fromkeys([*(options.get("modules_to_save") or []), *extra]))
    return LoraConfig(task_type="CAUSAL_LM", **options)


def standard_callbacks(
    resolved: ResolvedConfig, run_dir: Path, console, stop_on_signal: StopOnSignal, extra: list | None, benchmarks=None
) -> list:
    resumed = read_marker(Path(resolved.resume_checkpoint_path)) if resolved.resume_checkpoint_path else None
    marker = CheckpointMarker(
        run_dir,
        resolved.training.get("save_total_limit"),
        seconds_before=(resumed or {}).get("trained_seconds", 0.0),
        record={"config": resolved.to_json_dict(), "data": _fingerprint(run_dir)},
    )
    from leap_finetune.recipes.plots import Plots
    from leap_finetune.recipes.trackers import TrackerConfig, tracker_environment

    tracker_environment(resolved)

    # (Plots after MetricsLog: the last log of the run is in metrics.jsonl when the plots are drawn)
    callbacks = [
        FinishOnly(),
        ResumeChanges(resolved.resume_changes),
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
    every = resolved.evals.eval_steps or resolved.training.get("eval_steps") or 500
    if resolved.async_eval is not None and resolved.async_eval.mode != "sync":
        from leap_finetune.evaluation.async_eval import AsyncBenchmarks

        return AsyncBenchmarks(resolved, run_dir, console, every, template.text)
    renderer = Renderer(tokenizer, template, "all", None)
    vision = is_vision_model(resolved.model_id)
    benchmarks = load_benchmarks(resolved.evals, vision=vision, model_name=resolved.model_name)
    settings = resolved.image_processor.settings() if resolved.image_processor is not None else None
    processor = load_processor(resolved.model_id, tokenizer, settings) if vision and has_images(benchmarks) else None
    max_failures = resolved.async_eval.failure.max_consecutive if resolved.async_eval else 3
    return BenchmarkCallback(
        resolved.evals, benchmarks, renderer, run_dir, console, every, processor=processor, max_failures=max_failures
    )


# The benchmark results of the run's summary, end report and model card: each score, and a tool_call benchmark's
# sub-scores (its score is the exact-call accuracy; evaluation/runner.py)
SUMMARY_BENCHMARK_KEYS = ("/score", "/name", "/argument_f1", "/parsed", "/no_call")


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
    it returns goes into the summary. A full disk is an error that says so (disk_errors)."""
    with disk_errors(run_dir, trainer, resolved.training):
        return _train_evaluate_save(
            trainer, resolved, run_dir, tokenizer, console, stop_on_signal, samples, after_training
        )


def _train_evaluate_save(
    trainer,
    resolved: ResolvedConfig,
    run_dir: Path,
    tokenizer,
    console,
    stop_on_signal: StopOnSignal,
    samples: list[dict],
    after_training=None,
) -> dict:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from leap_finetune.evaluation.callback import EvaluationLog

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    benchmarks = next((c for c in trainer.callback_handler.callbacks if isinstance(c, EvaluationLog)), None)
    if benchmarks is not None:
        benchmarks.trainer = trainer
    resume = resolved.resume_checkpoint_path
    main = is_main_process()
    if main:
        _print_model_summary(console, trainer.model)
        if getattr(trainer, "is_fsdp_enabled", False):
            console.print(
                f"fsdp: the model is sharded over {trainer.accelerator.num_processes} workers "
                "(the final model is gathered on rank 0 to be saved)"
            )
    has_eval = trainer.eval_dataset is not None  # the baseline evaluation is logged at step 0 (eval_on_start)
    run_benchmarks = benchmarks is not None and main  # once, not once per rank
    baseline_benchmarks = benchmarks.evaluate("before training") if run_benchmarks and not resume else {}
    try:
        result = train_or_finish(trainer, resume, resolved.training.get("gradient_communication"))
    except BaseException:
        if run_benchmarks:  # async modes: no job or server outlives a crashed run
            benchmarks.finish(wait=False)
        raise
    extra = after_training(trainer) if after_training is not None else {}
    if not main:
        if trainer.state.global_step >= trainer.state.max_steps:
            if has_eval:
                _final_eval(trainer)  # the last evaluation is distributed too
            _full_state_dict(trainer)  # FSDP: every rank takes part in gathering the weights
        return {"global_step": trainer.state.global_step, "rank": int(os.environ.get("RANK", "0"))}
    # The whole run, also after resumes: after a resume the Trainer's loss covers only this process's
    # steps, so it is averaged over every logged step of metrics.jsonl instead; training time is summed
    # over the processes.
    history = metrics_history(RunFolder(run_dir).metrics)
    marker = next(c for c in trainer.callback_handler.callbacks if isinstance(c, CheckpointMarker))
    from leap_finetune.recipes.plots import Plots

    plots = next(c for c in trainer.callback_handler.callbacks if isinstance(c, Plots))
    train_loss = (
        history["train_loss"]
        if (resume or result is None) and history["train_loss"] is not None
        else (result.training_loss if result is not None else None)
    )
    summary = {
        "global_step": trainer.state.global_step,
        "train_loss": train_loss,
        "train_runtime_s": round(marker.trained_seconds(), 3),
        "tokens_seen": trainer.state.num_input_tokens_seen,
        **extra,
    }
    all_reduce = gradient_all_reduce(trainer)
    if all_reduce:
        summary["gradient_all_reduce"] = all_reduce
    rewards = history["rewards"]
    if rewards:  # GRPO: the mean reward of the first and the last (up to) 5 logged steps
        window = min(5, len(rewards))
        summary["initial_reward"] = sum(rewards[:window]) / window
        summary["final_reward"] = sum(rewards[-window:]) / window
    baseline = history["initial_eval"] or None
    if resume:
        baseline_benchmarks = history["initial_benchmarks"]
    if trainer.state.global_step < trainer.state.max_steps:
        if run_benchmarks:
            benchmarks.finish(wait=False)  # async modes: evaluations still running are stopped
        summary["stopped_early"] = True
        summary["stopped_by_signal"] = stop_on_signal.received
        plots.draw_in_background(trainer.is_world_process_zero())
        plots.wait()
        write_atomic(RunFolder(run_dir).summary, json.dumps(summary, indent=2))
        return summary
    if run_benchmarks:
        final = benchmarks.evaluate("after training")  # (async modes: the snapshot is handed over)
    if has_eval:  # before waiting for async evaluations: the other ranks are in this collective evaluation
        last = _final_eval(trainer)
    if run_benchmarks:
        finished = benchmarks.finish(wait=True)  # async modes: every evaluation's results, by training step
        if finished is not None:
            final = finished.get(trainer.state.global_step, {})
            if not resume:  # (resumed: the step-0 results were logged by the first process, read above)
                baseline_benchmarks = finished.get(0, {})
        summary["benchmarks"] = {k: v for k, v in final.items() if k.endswith(SUMMARY_BENCHMARK_KEYS)}
        summary["initial_benchmarks"] = {
            k: v for k, v in baseline_benchmarks.items() if k.endswith(SUMMARY_BENCHMARK_KEYS)
        }
    if has_eval:
        summary["eval_loss"] = float(last["eval_loss"])
        summary["initial_eval_loss"] = baseline.get("eval_loss") if baseline else None
        summary["eval_metrics"] = {k: float(v) for k, v in last.items() if k.startswith("eval_") and _is_number(v)}
        if baseline:
            summary["initial_eval_metrics"] = {
                k: float(v) for k, v in baseline.items() if k.startswith("eval_") and _is_number(v)
            }

    plots.draw_in_background(trainer.is_world_process_zero())  # every evaluation is logged by now
    # The model (merged for LoRA, plus the adapter) loadable with from_pretrained.
    final_model = trainer.model
    state_dict = _full_state_dict(trainer)
    if resolved.peft is not None:
        _save_atomic(
            RunFolder(run_dir).adapter,
            lambda path: (final_model.save_pretrained(path, state_dict=state_dict), tokenizer.save_pretrained(path)),
        )
        final_model = (
            _merged_from_adapter(resolved, tokenizer, RunFolder(run_dir).adapter)
            if state_dict is not None
            else final_model.merge_and_unload()
        )
        summary["adapter_dir"] = str(RunFolder(run_dir).adapter)
        state_dict = None
    saver = _processing_saver(resolved, tokenizer, console)
    _save_atomic(
        RunFolder(run_dir).model,
        lambda path: (final_model.save_pretrained(path, state_dict=state_dict), saver.save_pretrained(path)),
    )
    summary["model_dir"] = str(RunFolder(run_dir).model)
    if samples and not getattr(trainer, "is_fsdp_enabled", False):  # a sharded model generates on every rank only
        reader = getattr(trainer.data_collator, "reader", None)  # (an image run's collator: its processor)
        print_samples(console, "after training", final_model, tokenizer, samples, reader.processor if reader else None)
    plots.wait()
    summary["finished_at"] = time.time()  # by this process's clock: which run finished last (models.registry)
    write_atomic(RunFolder(run_dir).summary, json.dumps(summary, indent=2))
    return summary


OUT_OF_MEMORY = ("out of memory", "can't allocate memory", "DefaultCPUAllocator", "OutOfMemoryError")


@contextmanager
def disk_errors(run_dir: Path, trainer=None, training: dict | None = None):
    """What the user can fix when training or saving fails, said as such instead of a library's traceback: a
    full disk (or quota) - where, and that the complete checkpoints are intact (a checkpoint half-written when
    the disk filled up has no marker) -, running out of memory - which settings to change -, and the run folder
    deleted under the run."""
    from leap_finetune.errors import LeapError
    from leap_finetune.files import is_disk_full

    try:
        yield
    except (KeyboardInterrupt, LeapError):
        raise
    except BaseException as err:
        step = f" at step {trainer.state.global_step}" if trainer is not None and trainer.state is not None else ""
        kept = _saved_so_far(run_dir)
        if isinstance(err, (OSError, RuntimeError)) and not run_dir.is_dir():
            raise LeapError(
                f"the run folder was deleted while the run was training ({step.strip() or 'at its end'}): "
                "nothing more can be saved",
                where=str(run_dir),
                fix="start the run again (nothing of it is left to resume)",
            ) from None
        if is_disk_full(err):
            raise LeapError(
                f"the disk is full{step}: writing the run folder failed ({type(err).__name__})",
                where=str(run_dir),
                fix=f"free space on that disk (checkpoints: save_total_limit keeps fewer), then {kept}",
            ) from None
        if (
            isinstance(err, MemoryError)
            or isinstance(err, RuntimeError)
            and any(word in str(err) or word == type(err).__name__ for word in OUT_OF_MEMORY)
        ):
            t = training or {}
            colocated = bool(t.get("use_vllm")) and t.get("vllm_mode", "colocate") == "colocate"
            length = "max_completion_length" if "num_generations" in t else "max_length"  # (GRPO)
            batch = "batch_tokens" if t.get("batch_tokens") else "per_device_train_batch_size"
            keys = (batch, length, "gradient_checkpointing") + (("vllm_gpu_memory_utilization",) if colocated else ())
            settings = ", ".join(f"{k} {t[k]}" for k in keys if k in t)
            keep = "the tokens per step" if batch == "batch_tokens" else "the global batch"
            where = "GPU" if "CUDA" in str(err) or "cuda" in str(err) else "memory"
            # vLLM colocated holds its share of the GPU beside training (TRL's default 0.3: out of memory for full
            # fine-tuning of LFM2-1.2B at 64 completions on an H200, where 0.15 ran - bench/RESULTS.md)
            engine = (
                (
                    "lower vllm_gpu_memory_utilization (the share of the GPU vLLM keeps beside training; 0.15 ran "
                    "LFM2-1.2B at 64 completions on an H200) or set use_vllm: false (no engine memory), "
                )
                if colocated
                else ""
            )
            raise LeapError(
                f"out of {where}{step} ({settings})",
                where="training_config",
                fix=f"{engine}lower {batch} (raise gradient_accumulation_steps to keep {keep}), lower {length}, "
                "set gradient_checkpointing: true, or train LoRA "
                f"(peft_config); then {kept}",
            ) from None
        raise


def _saved_so_far(run_dir: Path) -> str:
    """What to do after the fix: resume from the last complete checkpoint, or run again when there is none."""
    from leap_finetune.runs.checkpoints import checkpoints, verify

    complete = [p for p in checkpoints(run_dir) if verify(p).ok] if run_dir.is_dir() else []
    if complete:
        return (
            f"resume with training_config.resume_from_checkpoint: latest (the last complete checkpoint, "
            f"{complete[-1].name}, is intact; one cut short is never resumed from)"
        )
    return "run again (no checkpoint was saved yet: nothing to resume)"


def train_or_finish(trainer, resume: str | None, gradient_communication: str | None = None):
    """trainer.train(), or - resumed from the run's last step - nothing to train: the checkpoint is loaded (its
    weights, optimizer, scheduler and state), and the end of training is done as transformers does it (the
    callbacks' on_train_end, the best model loaded where asked). Returns TrainOutput, or None when nothing was
    trained. `gradient_communication`: the training_config key (config/communication.py)."""
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


def _full_state_dict(trainer) -> dict | None:
    """FSDP: the whole model's weights gathered on rank 0 (on the CPU); a collective, so every rank calls
    it at the same point. Without FSDP: None (the model in memory is whole)."""
    if not getattr(trainer, "is_fsdp_enabled", False):
        return None
    return trainer.accelerator.get_state_dict(trainer.model)


def _merged_from_adapter(resolved: ResolvedConfig, tokenizer, adapter_dir: Path):
    """FSDP + LoRA: the sharded model cannot merge in place; the base model is loaded on the CPU and the
    saved adapter merged into it."""
    import torch
    from peft import PeftModel

    from leap_finetune.models.loading import load_model

    init_kwargs = {k: v for k, v in (resolved.training.get("model_init_kwargs") or {}).items() if k != "dtype"}
    base = load_model(resolved.model_id, tokenizer, init_kwargs, dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()


def _final_eval(trainer) -> dict:
    """The evaluation at the last step (run now unless the schedule already ran it there)."""
    last = next((e for e in reversed(trainer.state.log_history) if "eval_loss" in e), None)
    if last is None or last.get("step") != trainer.state.global_step:
        last = trainer.evaluate()
    return last


def metrics_history(path: Path) -> dict:
    """From metrics.jsonl: the mean training loss per step over the run (each logged loss is the mean
    of the steps since the previous log), and the step-0 evaluation and benchmark results."""
    from leap_finetune.files import read_metrics

    records = read_metrics(path)
    total, steps, previous = 0.0, 0, 0
    for record in records:
        if "loss" in record and _is_number(record["loss"]) and record.get("step", 0) > previous:
            span = record["step"] - previous
            total += float(record["loss"]) * span
            steps += span
            previous = record["step"]
    rewards = [float(r["reward"]) for r in records if "reward" in r and _is_number(r["reward"])]
    initial_eval = {k: v for r in records if r.get("step") == 0 for k, v in r.items() if k.startswith("eval_")}
    initial_benchmarks = {
        k: v for r in records if r.get("step") == 0 for k, v in r.items() if k.startswith("benchmark/")
    }
    return {
        "train_loss": total / steps if steps else None,
        "initial_eval": initial_eval,
        "initial_benchmarks": initial_benchmarks,
        "rewards": rewards,
    }


def _processing_saver(resolved: ResolvedConfig, tokenizer, console):
    """A vision-language model is saved with its processor (image settings + tokenizer), so that the
    folder loads with AutoProcessor; without torchvision only the tokenizer can be saved."""
    from leap_finetune.errors import LeapError
    from leap_finetune.models.vision import is_vision_model, load_processor

    if not is_vision_model(resolved.model_id):
        return tokenizer
    settings = resolved.image_processor.settings() if resolved.image_processor is not None else None
    try:
        return load_processor(resolved.model_id, tokenizer, settings)
    except LeapError as err:
        console.print(f"note: the model is saved without its image processor ({err.message})")
        return tokenizer


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _print_model_summary(console, model) -> None:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    console.print(f"model: {total:,} parameters, {trainable:,} trainable ({100 * trainable / total:.2f}%)")


def _save_atomic(target: Path, save) -> None:
    """Save into a staging folder that then takes the target's place whole (runs/atomic.py): a crash never leaves
    a half-written model, nor (as deleting first did) none."""
    from leap_finetune.runs.atomic import replace_folder

    replace_folder(target, lambda staging: save(str(staging)), before_swap=lambda: faults.point("final-save"))


def load_samples(run_dir: Path) -> list[dict]:
    path = RunFolder(run_dir).samples
    return json.loads(path.read_text()) if path.exists() else []


def print_samples(console, when: str, model, tokenizer, samples: list[dict], processor=None) -> None:
    """`processor`: a vision-language model's, for samples with pictures."""
    import torch

    was_training = model.training
    model.eval()
    console.print(f"[bold]sample answers {when}[/bold]")
    device = next(model.parameters()).device
    for sample in samples:
        if sample.get("images") and processor is not None:
            from leap_finetune.evaluation.generation import generate

            with torch.compiler.set_stance("force_eager"):
                answer = generate(
                    model,
                    tokenizer,
                    [sample["prompt"]],
                    max_new_tokens=sample.get("max_new_tokens", 64),
                    batch_size=1,
                    images=[sample["images"]],
                    processor=processor,
                )[0]
            console.print(
                f"  Q: [{len(sample['images'])} image(s)] {sample['question']}\n     model: {answer!r}   "
                f"expected: {sample['reference']!r}",
                markup=False,
                highlight=False,
            )
            continue
        ids = tokenizer(sample["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"].to(device)
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):  # compiled layers: training shapes only
            out = model.generate(
                ids,
                max_new_tokens=sample.get("max_new_tokens", 64),
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                use_cache=True,
            )
        # Special tokens stay visible (tool-call markers are part of the answer); generation stops at eos.
        new = out[0, ids.shape[1] :].tolist()
        if tokenizer.eos_token_id in new:
            new = new[: new.index(tokenizer.eos_token_id)]
        answer = tokenizer.decode([t for t in new if t != tokenizer.pad_token_id]).strip()
        console.print(
            f"  Q: {sample['question']}\n     model: {answer!r}   expected: {sample['reference']!r}",
            markup=False,
            highlight=False,
        )
    if was_training:
        model.train()
