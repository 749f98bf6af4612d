"""SFT recipe: the worker. It takes a resolved, serialisable config whose data the driver has
already prepared (validated, masked, tokenized) in the run folder, and only trains and saves.

Read top-down: arguments -> tokenizer -> data -> model -> trainer -> train -> save.
Ray or torchrun can call `train(resolved_dict)` unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.recipes.callbacks import CheckpointMarker, MetricsLog, RichProgress, StopOnSignal, write_atomic

PREPARED_DIR = "prepared"


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    """The keyword arguments for TRL's SFTConfig: the user's training_config (profile merged) plus
    what leap-finetune decides (precision, device, logging of real tokens)."""
    import torch

    if cuda is None:
        cuda = torch.cuda.is_available()
    args = dict(resolved.training)
    args["output_dir"] = run_dir
    # bf16 where the hardware has it, float32 otherwise; an explicit bf16/fp16 key wins.
    if "bf16" not in args and "fp16" not in args:
        args["bf16"] = bool(cuda and torch.cuda.is_bf16_supported())
        args["fp16"] = False
    args.setdefault("use_cpu", not cuda)
    # Data arrive rendered, masked and tokenized (input_ids + labels), so TRL must not re-mask.
    args["assistant_only_loss"] = False
    args["completion_only_loss"] = False
    if has_eval:
        args.setdefault("eval_strategy", "steps")
    else:
        args["eval_strategy"] = "no"
    args.setdefault("include_num_input_tokens_seen", "non_padding")
    args.setdefault("disable_tqdm", True)
    return args


def quiet_libraries() -> None:
    """Our progress bar and reports replace the libraries' per-step bars and notices."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def build_sft_config(args: dict):
    from trl import SFTConfig

    return SFTConfig(**args)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    import torch
    from datasets import load_from_disk
    from rich.console import Console
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import SFTTrainer

    from leap_finetune.data.chat_templates import load_chat_template
    from leap_finetune.models.loading import load_model, load_tokenizer
    from leap_finetune.models.packed_conv import enable_exact_packing

    resolved = ResolvedConfig.model_validate(resolved_json)
    quiet_libraries()
    run_dir = Path(resolved.run_dir)
    console = Console(stderr=True)

    # Data (prepared by the driver)
    train_dataset = load_from_disk(str(run_dir / PREPARED_DIR / "train"))
    eval_path = run_dir / PREPARED_DIR / "eval"
    eval_dataset = load_from_disk(str(eval_path)) if eval_path.exists() else None

    # Arguments
    args = build_sft_config(training_arguments(resolved, run_dir=str(run_dir), has_eval=eval_dataset is not None))
    dtype = torch.float32  # master weights; bf16 autocast when args.bf16

    # Tokenizer, with the official chat template users will run the trained model with
    tokenizer = load_tokenizer(resolved.model_id)
    template = load_chat_template(resolved.chat_template, tokenizer)
    tokenizer.chat_template = template.text

    # Model
    if args.packing or args.padding_free:
        console.print(f"packing: sequences kept apart by position ids (attention) and {enable_exact_packing()} (LFM2 convolutions)")
    model = load_model(resolved.model_id, tokenizer, dtype)
    model.config.use_cache = False
    peft_config = None
    if resolved.peft is not None:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", **resolved.peft)

    samples = _load_samples(run_dir)
    if samples:
        _print_samples(console, "before training", model, tokenizer, samples)

    stop_on_signal = StopOnSignal()
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[MetricsLog(run_dir / "metrics.jsonl"), CheckpointMarker(), RichProgress(console), stop_on_signal,
                   *(callbacks or [])],
    )
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)

    resume = resolved.resume_checkpoint_path
    _print_model_summary(console, trainer.model)
    baseline_eval_loss = None
    if eval_dataset is not None and not resume:
        baseline_eval_loss = trainer.evaluate().get("eval_loss")  # logged at step 0
    result = trainer.train(resume_from_checkpoint=resume)
    summary = {"global_step": trainer.state.global_step, "train_loss": result.training_loss,
               "train_runtime_s": result.metrics.get("train_runtime"),
               "tokens_seen": trainer.state.num_input_tokens_seen}
    if trainer.state.global_step < trainer.state.max_steps:
        summary["stopped_early"] = True
        summary["stopped_by_signal"] = stop_on_signal.received
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
        return summary
    if eval_dataset is not None:
        last = next((e for e in reversed(trainer.state.log_history) if "eval_loss" in e), None)
        if last is None or last.get("step") != trainer.state.global_step:  # not evaluated at the last step yet
            last = trainer.evaluate()
        summary["eval_loss"] = float(last["eval_loss"])
        summary["initial_eval_loss"] = baseline_eval_loss

    # Save: the model (merged for LoRA, plus the adapter) loadable with from_pretrained.
    final_model = trainer.model
    if peft_config is not None:
        _save_atomic(run_dir / "adapter", lambda path: (final_model.save_pretrained(path), tokenizer.save_pretrained(path)))
        final_model = final_model.merge_and_unload()
    _save_atomic(run_dir / "model", lambda path: (final_model.save_pretrained(path), tokenizer.save_pretrained(path)))
    summary["model_dir"] = str(run_dir / "model")
    if peft_config is not None:
        summary["adapter_dir"] = str(run_dir / "adapter")

    if samples:
        _print_samples(console, "after training", final_model, tokenizer, samples)
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def _print_model_summary(console, model) -> None:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    console.print(f"model: {total:,} parameters, {trainable:,} trainable ({100 * trainable / total:.2f}%)")


def _save_atomic(target: Path, save) -> None:
    """Save into a temporary folder, then rename: a crash never leaves a half-written model."""
    tmp = target.with_name(f".{target.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    save(str(tmp))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)


def _load_samples(run_dir: Path) -> list[dict]:
    path = run_dir / PREPARED_DIR / "samples.json"
    return json.loads(path.read_text()) if path.exists() else []


def _print_samples(console, when: str, model, tokenizer, samples: list[dict]) -> None:
    import torch

    was_training = model.training
    model.eval()
    console.print(f"[bold]sample answers {when}[/bold]")
    device = next(model.parameters()).device
    for sample in samples:
        ids = tokenizer(sample["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"].to(device)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=sample.get("max_new_tokens", 64), do_sample=False,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                 use_cache=True)
        # Special tokens stay visible (tool-call markers are part of the answer); generation stops at eos.
        new = out[0, ids.shape[1]:].tolist()
        if tokenizer.eos_token_id in new:
            new = new[: new.index(tokenizer.eos_token_id)]
        answer = tokenizer.decode([t for t in new if t != tokenizer.pad_token_id]).strip()
        console.print(f"  Q: {sample['question']}\n     model: {answer!r}   expected: {sample['reference']!r}",
                      markup=False, highlight=False)
    if was_training:
        model.train()
