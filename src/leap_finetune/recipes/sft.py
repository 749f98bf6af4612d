"""SFT recipe: the worker. It takes a resolved, serialisable config whose data the driver has
already prepared (validated, masked, tokenized) in the run folder, and only trains and saves.

Read top-down: arguments -> data -> tokenizer + model -> trainer -> train, evaluate, save.
Ray or torchrun can call `train(resolved_dict)` unchanged.
"""

from __future__ import annotations

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.methods import METHODS
from leap_finetune.recipes import common, optimizers, speed, vision
from leap_finetune.recipes.host_syncs import DeviceSideMetrics
from leap_finetune.recipes.ranks import is_main_process
from leap_finetune.recipes.samples import load_samples, print_samples


def config_class():
    """The training arguments of this type (methods/ names the class)."""
    return METHODS["sft"].arguments_class()


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    args = common.common_arguments(resolved, run_dir=run_dir, has_eval=has_eval, cuda=cuda)
    # TRL's own padding-free collator refuses a custom collator: an image run's collator (recipes/vision.py)
    # flattens the batch itself (`flat_batches` below), and TRL sees padded batches
    fast = speed_plan(resolved, cuda)
    args["padding_free"] = fast.padding_free and not resolved.vision
    speed.apply_trainer_defaults(args, fast)
    # Data arrive rendered, masked, truncated and tokenized (input_ids + labels): TRL's documented switch
    # skips its own preparation; what it would still do (packing, shuffling) is `for_trainer` below.
    args["dataset_kwargs"] = {"skip_prepare_dataset": True}
    args["assistant_only_loss"] = False
    args["completion_only_loss"] = False
    if fast.padding_free and not args.get("packing"):
        # Rows were already cut to max_length when the data were prepared; TRL refuses padding-free
        # batches with max_length set because it would not enforce it itself.
        args["max_length"] = None
    return args


def trainer_class():
    from trl import SFTTrainer

    from leap_finetune.recipes.host_syncs import score_trained_tokens_only_on_cpu
    from leap_finetune.recipes.sampling import balanced_sampler, epoch_callback, token_budget_sampler

    score_trained_tokens_only_on_cpu()

    class LeapSFTTrainer(DeviceSideMetrics, vision.VisionRate, SFTTrainer):
        """SFTTrainer whose `batch_rebalance` sampler balances tokens for padding-free batches and reads
        row lengths from the Arrow column (recipes/sampling.py), and whose steps keep their metrics on
        the device until logging (recipes/host_syncs.py)."""

        flat_batches = False  # padding-free batches (TRL's, or an image run's own collator)
        batch_tokens = None  # `batch_tokens`: micro-batches cut by tokens (data/token_batches.py)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._sampler_epoch = epoch_callback()
            self.add_callback(self._sampler_epoch)

        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            flat = self.flat_batches or bool(self.args.padding_free)
            if self.batch_tokens and dataset is not None:
                sampler = token_budget_sampler(self.args, dataset, self.batch_tokens, padding_free=flat)
            elif self.args.train_sampling_strategy != "batch_rebalance" or dataset is None:
                return super()._get_train_sampler(train_dataset)
            else:
                sampler = balanced_sampler(self.args, dataset, padding_free=flat)
            self._sampler_epoch.sampler = sampler  # (its epoch is set at every epoch's start, resumes included)
            return sampler

    return LeapSFTTrainer


def for_trainer(dataset, args, packing: bool):
    """What SFTTrainer's preparation does to already tokenized, truncated rows, in its order: shuffle
    and pack (TRL's public `pack_dataset`), then shuffle. Everything else it does is done by the driver."""
    from trl.data_utils import pack_dataset

    if packing:
        dataset = dataset.select_columns(["input_ids", "labels"])
        if args.shuffle_dataset:
            dataset = dataset.shuffle(seed=args.seed)
        dataset = pack_dataset(dataset, args.max_length, args.packing_strategy, {"num_proc": args.dataset_num_proc})
    if args.shuffle_dataset:
        dataset = dataset.shuffle(seed=args.seed)
    return dataset


def speed_plan(resolved: ResolvedConfig, cuda: bool | None = None) -> speed.SpeedPlan:
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    return speed.plan(resolved.training, resolved.model_id, cuda, lora=resolved.peft is not None)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    start = common.start_worker(resolved_json, config_class(), training_arguments)
    resolved, run_dir, console, args = start.resolved, start.run_dir, start.console, start.args
    train_dataset, eval_dataset = start.train_dataset, start.eval_dataset
    train_dataset = for_trainer(train_dataset, args, args.packing)
    if eval_dataset is not None:
        eval_dataset = for_trainer(eval_dataset, args, args.packing if args.eval_packing is None else args.eval_packing)
    fast = speed_plan(resolved)
    flat = bool(args.padding_free or (resolved.vision and fast.padding_free))  # (see training_arguments)
    tokenizer, model = common.load_tokenizer_and_model(resolved, packing=args.packing or flat, console=console)
    vision.prepare_vision_model(resolved, model, console)
    if is_main_process():
        console.print(fast.line)
    if resolved.training.get("precision") == "fp8":  # (before compile: the casts are fused into each layer)
        from leap_finetune.recipes.fp8 import use_fp8

        use_fp8(model, console if is_main_process() else None)
    if fast.compile_layers:
        speed.compile_layers(model)
    samples = load_samples(run_dir) if is_main_process() else []
    collator = vision.image_collator(resolved, tokenizer, args, padding_free=flat)  # (None for text: TRL's own)
    processor = collator.reader.processor if collator is not None else None
    if samples:
        print_samples(console, "before training", model, tokenizer, samples, processor)

    from leap_finetune.recipes.callbacks import StopOnSignal

    stop_on_signal = StopOnSignal()
    trainer_cls = trainer_class()
    trainer_cls.flat_batches = flat
    trainer_cls.batch_tokens = resolved.training.get("batch_tokens")
    if resolved.vision:
        trainer_cls.vision_lr_multiplier = resolved.training.get("vision_encoder_lr_multiplier")
    trainer = trainer_cls(
        model=common.with_adapter(resolved, model),
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=collator,
        processing_class=tokenizer,
        peft_config=common.lora_config(resolved),
        callbacks=common.standard_callbacks(
            resolved,
            run_dir,
            console,
            stop_on_signal,
            speed.with_compile_phase(callbacks, console, fast.compile_layers),
            common.benchmark_callback(resolved, tokenizer, run_dir, console),
        ),
    )
    optimizers.use_precision(trainer, resolved.training.get("optimizer_precision"))
    return common.train_evaluate_save(trainer, resolved, run_dir, tokenizer, console, stop_on_signal, samples)
