"""Settings that would do nothing in this run: a key that applies only in another mode, or to data the run does not
have. Each is said (a `note:` line at validate, plan and run, naming the key, why it does nothing and what would make
it count), never dropped in silence. Only keys the user wrote are named: a profile's defaults are not the user's.

The pairs, walked block by block: async_eval's keys of the modes it is not in; grpo_rollout's server keys with no
local server; vLLM's training keys with use_vllm off; a dataset's test_size beside its val_path; peft_config's LoRA
keys with use_peft: false; warm-up under a constant schedule; save_* with save_strategy: no; logging_steps with
logging_strategy: no; evaluation keys with nothing to evaluate (no eval split, no benchmark); evals' sampling keys
(temperature, top_p) without evals.do_sample; the vision encoder's learning rate with the encoder frozen; the router
losses and lora_experts on a model without experts.
"""

from __future__ import annotations

# async_eval's keys and the modes they act in (mode itself, and the failure policy, act in every mode)
ASYNC_EVAL_MODES = {
    "reserved": ("reserved",),
    "sbatch": ("sidecar",),
    "vllm_gpus": ("sidecar", "reserved"),
    "tensor_parallel_size": ("sidecar", "reserved"),
    "gpu_memory_utilization": ("sidecar", "reserved"),
    "on_overlap": ("sidecar", "reserved"),
    "wait_at_end_s": ("sidecar", "reserved"),
}
# grpo_rollout's keys of the local servers (the rollout server; the judge's port and GPUs are checked at load)
SERVER_KEYS = ("tensor_parallel_size", "dtype", "gpu_memory_utilization", "max_model_len", "server_start_timeout_s")


def config_notes(model, resolved_training: dict, user_training: set[str], peft_user: dict | None) -> list[str]:
    """The notes the config alone decides (at load: `model` is the parsed config)."""
    notes = []
    notes += _async_eval(model.async_eval)
    notes += _evals(model.evals)
    notes += _grpo_rollout(model, resolved_training)
    notes += _dataset(model.dataset)
    notes += _peft(peft_user)
    notes += _training(resolved_training, user_training)
    if "reference_adapter" in user_training and getattr(model, "adapter_path", None) is None:
        notes.append(
            "training_config.reference_adapter has no effect without adapter_path (it chooses between the base "
            "with and without the adapter you continue)"
        )
    return notes


def _async_eval(settings) -> list[str]:
    if settings is None:
        return []
    said = sorted(
        k for k in settings.model_fields_set if k in ASYNC_EVAL_MODES and settings.mode not in ASYNC_EVAL_MODES[k]
    )
    return [
        f"async_eval.{key} has no effect: async_eval.mode is {settings.mode} (it acts in mode "
        f"{' or '.join(ASYNC_EVAL_MODES[key])}); remove it, or set that mode"
        for key in said
    ]


# the evals keys that only act when benchmarks sample (evaluation/generation.py, server.py, episodes_benchmark.py)
SAMPLING_KEYS = ("temperature", "top_p")


def _evals(evals) -> list[str]:
    if evals is None or evals.do_sample:
        return []
    said = [k for k in SAMPLING_KEYS if k in evals.model_fields_set]
    if not said:
        return []
    return [
        f"evals.{', evals.'.join(said)}: no effect with evals.do_sample: false (benchmarks decode greedily, "
        "the default); set evals.do_sample: true to sample with them, or remove them"
    ]


def _grpo_rollout(model, training: dict) -> list[str]:
    rollout = getattr(model, "grpo_rollout", None)
    notes = []
    if rollout is not None and not rollout.server_gpus:
        set_here = sorted(k for k in rollout.model_fields_set if k in SERVER_KEYS)
        if training.get("vllm_mode") == "server":  # (an external server: its start timeout is TRL's wait for it)
            set_here = [k for k in set_here if k != "server_start_timeout_s"]
        judge = getattr(getattr(model, "rewards", None), "judge", None)
        local_judge = judge is not None and getattr(judge, "base_url", None) is None
        if set_here and not local_judge:
            notes.append(
                f"grpo_rollout.{', grpo_rollout.'.join(set_here)}: no effect without a local server "
                "(server_gpus is 0 and no local judge): colocated vLLM takes training_config.vllm_* keys instead"
            )
    from leap_finetune.methods import method_of

    if method_of(model).rewards and not training.get("use_vllm"):
        vllm = sorted(k for k in (model.training_config or {}) if k.startswith("vllm_"))
        if vllm:
            notes.append(
                f"training_config.{', training_config.'.join(vllm)}: no effect with use_vllm: false (rollouts come "
                "from leap-finetune's sampler or transformers' generate)"
            )
    return notes


def _dataset(dataset) -> list[str]:
    items = dataset if isinstance(dataset, list) else [dataset] if dataset is not None else []
    notes = []
    for index, item in enumerate(items):
        name = "dataset" if not isinstance(dataset, list) else f"dataset[{index}]"
        if item.val_path and "test_size" in item.model_fields_set:
            notes.append(f"{name}.test_size has no effect: {name}.val_path is the evaluation data; remove one")
    return notes


def _peft(user: dict | None) -> list[str]:
    if not isinstance(user, dict) or user.get("use_peft", True) is not False:
        return []
    lora = sorted(k for k in user if k not in ("use_peft", "extends"))
    if not lora:
        return []
    return [
        f"peft_config.{', peft_config.'.join(lora)}: no effect with use_peft: false (a full fine-tune); "
        "use_peft: true trains LoRA with them"
    ]


def _training(training: dict, user: set[str]) -> list[str]:
    notes = []
    if training.get("lr_scheduler_type") == "constant" and training.get("warmup_steps") and "warmup_steps" in user:
        notes.append(
            "training_config.warmup_steps has no effect with lr_scheduler_type: constant (no warm-up); "
            "use constant_with_warmup"
        )
    if training.get("save_strategy") == "no":
        saved = sorted(k for k in ("save_steps", "save_total_limit") if k in user)
        if saved:
            notes.append(
                f"training_config.{', training_config.'.join(saved)}: no effect with save_strategy: no "
                "(no checkpoint is saved: an interrupted run cannot resume)"
            )
    if training.get("logging_strategy") == "no" and "logging_steps" in user:
        notes.append("training_config.logging_steps has no effect with logging_strategy: no")
    if "vision_encoder_lr_multiplier" in user and training.get("train_vision_encoder") is False:
        why = "you set it" if "train_vision_encoder" in user else "LoRA's default: adapters on the language model only"
        notes.append(
            f"training_config.vision_encoder_lr_multiplier has no effect: the vision encoder is frozen "
            f"(train_vision_encoder: false, {why}); set train_vision_encoder: true to train it at that rate"
        )
    checkpointing = training.get("activation_checkpointing") or training.get("gradient_checkpointing")
    for key in ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"):
        if key in user and not checkpointing:
            notes.append(
                f"training_config.{key} has no effect with activation checkpointing off; set activation_checkpointing:"
                " true (the memory planner turns it on by itself only where a GPU's memory needs it)"
            )
    return notes


def data_notes(resolved, prepared) -> list[str]:
    """The notes that need the prepared rows: evaluation keys with nothing to evaluate, and evaluation data asked
    for (val_path, test_size) that gave no rows."""
    if prepared is None or len(prepared.eval):
        return []
    emptied = _eval_data_that_gave_nothing(resolved)
    if emptied or resolved.evals is not None:
        return emptied
    user = set(resolved.user_training_keys)
    asked = sorted(k for k in ("eval_strategy", "eval_steps", "per_device_eval_batch_size") if k in user)
    if "eval_strategy" in asked and resolved.training.get("eval_strategy") == "no":
        asked.remove("eval_strategy")
    if not asked:
        return []
    return [
        f"training_config.{', training_config.'.join(asked)}: no effect: the run has no evaluation rows (no "
        "dataset.test_size, val_path or test file) and no benchmarks; set dataset.test_size: 0.05 (or val_path) "
        "to evaluate"
    ]


def _eval_data_that_gave_nothing(resolved) -> list[str]:
    """val_path or test_size set, and no evaluation row left (every val_path row invalid and skipped, or a
    test_size that rounds to nothing): no eval loss will be computed - a metric over nothing, said."""
    from leap_finetune.data.prepared import dataset_items

    asked = [i for i in dataset_items(resolved) if i is not None and (i.val_path or i.test_size)]
    if not asked:
        return []
    named = ", ".join(
        f"{i.path}: val_path {i.val_path}" if i.val_path else f"{i.path}: test_size {i.test_size}" for i in asked
    )
    return [
        f"no evaluation rows: the evaluation data asked for ({named}) gave none (its rows invalid and skipped, or "
        "too few rows to hold any out), so no eval loss is computed; fix or replace the evaluation rows "
        "(dataset.on_invalid: error lists every problem)"
    ]


def router_notes(user_training: set[str], peft_user: dict | None, model_id: str, quantized: bool = False) -> list[str]:
    """The mixture-of-experts keys (models/moe_router.py, lora_experts) on a model whose routers they would act on:
    none for a dense model. Unknown model types (no config at hand) are not judged."""
    from leap_finetune.models.architectures import architecture
    from leap_finetune.models.registry import model_type

    kind = model_type(model_id)
    found = architecture(kind)
    if found is not None and found.moe:
        notes = []
        if quantized:
            notes.append(
                "peft_config.quantization: bitsandbytes quantizes linear layers only; the experts of a mixture of "
                "experts are 3-D weights and stay bf16 (most of the model: `plan` shows the base's size)"
            )
        return notes
    if kind is None:
        return []
    what = f"{model_id} (model type {kind}) has no experts"
    notes = [
        f"training_config.{key} has no effect: {what}; it acts on mixture-of-experts models (LFM2-8B-A1B, ...); "
        "remove it"
        for key in ("router_aux_loss_coef", "router_z_loss_coef")
        if key in user_training
    ]
    if (peft_user or {}).get("lora_experts"):
        notes.append(f"peft_config.lora_experts has no effect: {what}; remove it")
    return notes


def qat_notes(model, peft: dict | None) -> list[str]:
    """With qat: a LoRA layer trains merged through the rounding (fake_quant(W + BA)), where its dropout cannot
    apply; a start_step past max_steps never starts."""
    if model.qat is None:
        return []
    notes = []
    if peft and peft.get("lora_dropout"):
        notes.append(
            f"peft_config.lora_dropout ({peft['lora_dropout']}) has no effect with qat: each LoRA layer runs merged "
            "through the target's rounding, where dropout cannot apply; set it to 0"
        )
    max_steps = (model.training_config or {}).get("max_steps")
    if isinstance(max_steps, int) and 0 < max_steps <= model.qat.start_step:
        notes.append(
            f"qat.start_step ({model.qat.start_step}) has no effect: training stops at max_steps {max_steps} first"
        )
    return notes
