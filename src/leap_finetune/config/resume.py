"""What a resume may change and what it must keep (`resume_allow_changes` is checked against these when the config
loads; launch/plan.py compares the resumed run's config with them)."""

from __future__ import annotations

# What a resume must keep: the run's model, data and the settings that decide what one step is.
RESUME_KEEPS = ("model_id", "training_type", "chat_template", "loss_on", "peft", "retrieval")
RESUME_KEEPS_DATA = (
    "path",
    "val_path",
    "limit",
    "test_size",
    "split",
    "subset",
    "on_invalid",
    "weight",
    "epochs",
    "hold_out_tools",
    "augment_tools",
)
# training_config keys that no key can change on a resume: the data each step reads and its order, the model's
# shape, and the optimizer whose state the checkpoint holds
RESUME_KEEPS_TRAINING = (
    "max_length",
    "loss_on_thinking",
    "batch_tokens",
    "packing",
    "padding_free",
    "seed",
    "truncation_mode",
    "model_init_kwargs",
    "data_seed",
    "train_sampling_strategy",
    "shuffle_dataset",
    "dataloader_drop_last",
    "group_by_length",
    "packing_strategy",
    "optim",
    "optim_args",
    "optim_target_modules",
    "optimizer_precision",
    # a vision-language run's parts and the vision encoder's optimizer groups (a checkpoint's optimizer state holds
    # them; recipes/vision.py)
    "train_vision_encoder",
    "train_projector",
    "train_language_model",
    "vision_encoder_lr_multiplier",
)
# training_config keys a resume may change freely: how long to train, how often to log, evaluate and save,
# where to report, memory and speed knobs that leave the arithmetic alone (the batch: see global_batch)
RESUME_FREE_TRAINING = frozenset(
    (
        "max_steps",
        "num_train_epochs",
        "logging_steps",
        "logging_strategy",
        "logging_first_step",
        "logging_nan_inf_filter",
        "save_steps",
        "save_strategy",
        "save_total_limit",
        "save_only_model",
        "eval_steps",
        "eval_strategy",
        "eval_delay",
        "eval_on_start",
        "per_device_eval_batch_size",
        "eval_accumulation_steps",
        "prediction_loss_only",
        "metric_for_best_model",
        "greater_is_better",
        "load_best_model_at_end",
        "report_to",
        "run_name",
        "project",
        "disable_tqdm",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "include_num_input_tokens_seen",
        "resume_from_checkpoint",
        "resume_allow_changes",
        "ddp_timeout",
        "ddp_bucket_cap_mb",
        "ddp_find_unused_parameters",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "torch_empty_cache_steps",
        "push_to_hub",
        "hub_model_id",
        "hub_strategy",
        "hub_private_repo",
        "log_level",
        "log_level_replica",
        "logging_dir",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "trackio_space_id",
        "use_vllm",
        "cache_implementation",
    )
)
RESUME_FREE_PREFIXES = ("vllm_",)  # GRPO: where and how rollouts are generated
# other parts of the config a resume may change when resume_allow_changes names them (applied from the resumed step)
RESUME_ALLOWABLE = ("rewards",)
# ... of which these keys change how the run is served, not what it trains: free (a judge moved to another host,
# given more time after it stopped the run)
OPERATIONAL = {
    "rewards": {
        "judge": (
            "base_url",
            "timeout_s",
            "max_concurrency",
            "retries",
            "max_failed_steps",
            "check_at_validate",
            "api_key_env",
        ),
        "": ("check_at_validate",),
    },
    "retrieval": {"": ("mini_batch_size",)},
}  # (cached_mnrl's memory knob: the same gradients)
