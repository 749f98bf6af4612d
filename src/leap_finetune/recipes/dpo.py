"""DPO recipe: TRL's DPOTrainer on pairs the driver has rendered and tokenized.

With LoRA the reference model is the base model with the adapter disabled (no second copy in
memory); a full fine-tune loads a frozen copy, unless `precompute_ref_log_probs: true` computes the
reference log-probs once before training and frees it.
"""

from __future__ import annotations

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.methods import METHODS, method_of
from leap_finetune.recipes import common, optimizers, speed, vision
from leap_finetune.recipes.ranks import is_main_process


def config_class():
    """The training arguments of this type (methods/ names the class)."""
    return METHODS["dpo"].arguments_class()


def trainer_class():
    from trl import DPOTrainer

    from leap_finetune.recipes.host_syncs import score_trained_tokens_only_on_cpu

    score_trained_tokens_only_on_cpu()  # (the prompt's positions: no log-prob needed)

    class LeapDPOTrainer(vision.VisionRate, DPOTrainer):
        """TRL re-tokenizes every dataset from text; ours arrive as prompt_ids / chosen_ids /
        rejected_ids, rendered with the official template and checked by the driver (which also
        drops and reports rows that max_length would empty), so preparation is skipped."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            if "prompt_ids" in dataset.column_names:
                return dataset
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)

    return LeapDPOTrainer


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    args = common.common_arguments(resolved, run_dir=run_dir, has_eval=has_eval, cuda=cuda)
    fast = speed_plan(resolved, cuda)
    user_pads = "pad_to_multiple_of" in resolved.training
    speed.apply_trainer_defaults(args, fast)
    if not user_pads:
        args.pop("pad_to_multiple_of", None)  # (flat rows pad themselves: models/flat_rows.py)
    if method_of(resolved).replaces_trainer_padding_free:
        # TRL 1.16's own padding_free for DPO is disabled (it warns and pads); leap-finetune's flat rows do it
        args["padding_free"] = False
    return args


def speed_plan(resolved: ResolvedConfig, cuda: bool | None = None) -> speed.SpeedPlan:
    """DPO and KTO: padding-free through leap-finetune's flat rows (models/flat_rows.py) where LFM2 allows it;
    image rows stay padded."""
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    flat = method_of(resolved).flat_rows and not resolved.vision
    return speed.plan(resolved.training, resolved.model_id, cuda, flat_batches=flat, lora=resolved.peft is not None)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    return run_preference(resolved_json, callbacks, config_class(), trainer_class())


def run_preference(resolved_json: dict, callbacks: list | None, config_cls, trainer_cls) -> dict:
    """The DPO and KTO worker (they differ only in their TRL classes)."""
    from leap_finetune.models import flat_rows
    from leap_finetune.models.loading import load_model
    from leap_finetune.models.varlen_attention import use_varlen_attention

    start = common.start_worker(resolved_json, config_cls, training_arguments)
    resolved, run_dir, console, args = start.resolved, start.run_dir, start.console, start.args
    train_dataset, eval_dataset = start.train_dataset, start.eval_dataset
    fast = speed_plan(resolved)
    tokenizer, model = common.load_tokenizer_and_model(resolved, packing=fast.padding_free, console=console)
    vision.prepare_vision_model(resolved, model, console)
    peft_config = common.lora_config(resolved)
    ref_model = None
    # a full fine-tune's reference: a frozen copy of the model (adapter_path: TRL's own - a frozen copy of the
    # adapter beside the trained one, common.adapter_reference)
    if peft_config is None and resolved.adapter_path is None and not args.precompute_ref_log_probs:
        ref_model = load_model(
            resolved.model_id, tokenizer, resolved.training.get("model_init_kwargs"), dtype=model.dtype
        )
        ref_model.config.use_cache = False
    # KTO's batches hold completions and KL completions, handed to the model in separate calls with the same keys:
    # each call is laid out from its own attention mask (one host read per call) instead of by the collator
    from_mask = method_of(resolved).kl_pairs
    flat = fast.padding_free and all(
        use_varlen_attention(each) is not None
        and flat_rows.enable(each, from_mask=from_mask, multiple=speed.PAD_TO_MULTIPLE_OF)
        for each in (model, ref_model)
        if each is not None
    )
    if is_main_process():
        console.print(fast.line if flat == fast.padding_free else fast.line.replace("padding-free", "padded"))
    if fast.compile_layers and not resolved.vision:
        for each in (model, ref_model):
            if each is not None:
                speed.compile_layers(each)

    from leap_finetune.recipes.callbacks import StopOnSignal

    stop_on_signal = StopOnSignal()
    if resolved.vision:
        trainer_cls.vision_lr_multiplier = resolved.training.get("vision_encoder_lr_multiplier")
    trainer = trainer_cls(
        model=common.with_adapter(resolved, model),
        ref_model=ref_model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=vision.image_collator(resolved, tokenizer, args),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=common.standard_callbacks(
            resolved,
            run_dir,
            console,
            stop_on_signal,
            speed.with_compile_phase(callbacks, console, fast.compile_layers),
            common.benchmark_callback(resolved, tokenizer, run_dir, console),
        ),
    )
    common.adapter_reference(trainer, resolved)
    optimizers.use_precision(trainer, resolved.training.get("optimizer_precision"))
    if flat and not from_mask:
        trainer.data_collator = flat_rows.FlatRowsCollator(trainer.data_collator, speed.PAD_TO_MULTIPLE_OF)
    return common.train_evaluate_save(trainer, resolved, run_dir, tokenizer, console, stop_on_signal, [])
