"""`training_config` -> the trainer's settings as the run uses them: the profile (`extends`) under the user's keys,
each key checked against the training type's trainer config and leap-finetune's own keys (config/own_keys.py:
their types and choices), then the values against their types, ranges and the rules across keys.

Each `check_<thing>` raises one precise error; `resolve_training` calls them in the order the messages are
expected (a key's own problem before the values' rules).
"""

from __future__ import annotations

import importlib.util

from leap_finetune.config import communication, own_keys, profiles
from leap_finetune.config.arguments import check_training_values
from leap_finetune.config.precision import check_matmul_precision, check_optimizer_precision
from leap_finetune.config.rules import check_batch_tokens, check_router_coefs, check_training_rules
from leap_finetune.config.schema import LeapConfigModel
from leap_finetune.config.suggest import did_you_mean, other_type_key, unknown_key_fix
from leap_finetune.config.trackers import check_report_to
from leap_finetune.errors import LeapError
from leap_finetune.methods import METHODS, method_of
from leap_finetune.validate.keys import trainer_arg_fields
from leap_finetune.validate.resume import check_resume

LOSS_ON = own_keys.choices("loss_on")

# Training arguments that leap-finetune decides itself; setting them would be silently ignored, so
# they are rejected with the key to use instead.
MANAGED_TRAINING_KEYS = {
    "output_dir": "set the top-level `output_dir` (runs go to outputs/{project_name}/{run_name} by default)",
    "completion_only_loss": "use `loss_on: assistant | all | final_assistant`",
    "chat_template_path": "set the top-level `chat_template` (a name or a .jinja file)",
    "dataset_text_field": "leap-finetune renders `messages` with the chat template itself",
    "dataset_kwargs": "leap-finetune prepares the dataset itself",
    "eos_token": "the chat template's end-of-turn token is used",
    "reward_weights": "set rewards.weights (GRPO: one per reward function, then the judge's)",
}


def resolve_training(model: LeapConfigModel, where: str, vision: bool = False) -> tuple[dict, str, str | None]:
    """(the merged training_config, loss_on, resume_from_checkpoint)."""
    user = dict(model.training_config)
    method = method_of(model)
    profile_name = check_extends(user.pop("extends", None), model, vision, where)
    own = set(own_keys.keys_of(method))
    # (the trainer's fields are read only when there is a key to check: an evaluation-only config imports no TRL;
    # `extends` was taken out above, so it is not suggested for a misspelt key)
    allowed = (trainer_arg_fields(model.training_type) if user else set()) | own - {"extends"}
    for key in user:
        check_key(key, user, model, own, where)
        if key not in allowed and key != "assistant_only_loss":
            raise unknown_training_key(key, model, allowed, where)
    fold_assistant_only_loss(user, where)
    merged = profiles.training_profile(profile_name)
    merged.update(user)
    if isinstance(merged.get("resume_from_checkpoint"), bool):  # (true: the HF Trainer's "the last checkpoint")
        merged["resume_from_checkpoint"] = "latest" if merged["resume_from_checkpoint"] else None
        user["resume_from_checkpoint"] = merged["resume_from_checkpoint"]
    merged = check_values(model, user, merged, where)
    loss_on = check_loss_on(merged.pop("loss_on", "assistant"), where)
    if method.kl_pairs:
        check_kto_batch_size(merged, where)
    resume = check_resume(merged, where, model.training_type)
    return merged, loss_on, resume


def check_extends(name: str | None, model: LeapConfigModel, vision: bool, where: str) -> str:
    """The profile the user's keys override: by default the type's own (its vision profile for a vision-language
    model); one of another type, or the vision profile for a text model, is refused."""
    method = method_of(model)
    own_profile = method.profile
    name = name or (method.vision_profile if vision else own_profile)
    if name in profiles.PEFT_PROFILES:
        raise LeapError(
            f"{name} is a profile of peft_config (the adapters), not of training_config",
            where=where,
            fix=f"move it: peft_config: {{extends: {name}}}, and leave training_config.extends out (or {own_profile})",
        )
    if name not in own_keys.choices("extends"):
        raise LeapError(
            f"unknown profile '{name}' in training_config.extends",
            where=where,
            fix=unknown_key_fix(str(name), own_keys.choices("extends")),
        )
    if name == method.vision_profile and name != own_profile and not vision:
        raise LeapError(
            f"training_config.extends is {name}, the profile for vision-language models, and "
            f"'{model.model_name}' is a text model",
            where=where,
            fix=f"use extends: {own_profile} (or leave extends out)",
        )
    if name not in (own_profile, method.vision_profile):
        raise LeapError(
            f"training_config.extends is {name}, a profile for another training type than {model.training_type}",
            where=where,
            fix=f"use extends: {own_profile} (or leave extends out)",
        )
    return name


def check_key(key: str, user: dict, model: LeapConfigModel, own: set[str], where: str) -> None:
    """One key of the user's training_config, before the profile is merged: not one leap-finetune decides, not
    leap-finetune's for another type, and an own key's value of its declared type."""
    if key in MANAGED_TRAINING_KEYS:
        raise LeapError(
            f"training_config.{key} is decided by leap-finetune", where=where, fix=MANAGED_TRAINING_KEYS[key]
        )
    if key == "loss_on" and key not in own:
        raise LeapError(
            f"training_config.loss_on applies to sft; {model.training_type} trains on the completion tokens",
            where=where,
            fix="remove loss_on",
        )
    if key == "torch_compile" and user[key] and method_of(model).fused_lm_loss:
        raise LeapError(
            "training_config.torch_compile compiles the whole model, TRL's fused LM-head loss included; on an "
            "H200 that trained with a loss of 0 from the first step (bench/RESULTS.md)",
            where=where,
            fix="use `compile_layers: true` (torch.compile per decoder layer; already the default for LFM2 on "
            "a CUDA GPU)",
        )
    if key in own:
        own_keys.check_switch(key, user[key], where)
        if key == "optimizer_precision":
            check_optimizer_precision(user, where, lora=bool(model.peft_config))
        if key == "precision":
            check_matmul_precision(user, where)


def unknown_training_key(key: str, model: LeapConfigModel, allowed: set[str], where: str) -> LeapError:
    """A key neither the trainer's nor leap-finetune's: said as another type's key where it is one."""
    owners = _types_with_key(key, model.training_type)
    if owners:
        message, fix = other_type_key(key, model.training_type, owners)
        return LeapError(message, where=where, fix=fix)
    owner = (
        "sentence-transformers' training arguments"
        if method_of(model).retrieval
        else f"TRL's {model.training_type.upper()}Config"
    )
    return LeapError(
        f"unknown key '{key}' in training_config (not a leap-finetune key, nor one of {owner})",
        where=where,
        fix=unknown_key_fix(key, allowed),
    )


def _types_with_key(key: str, training_type: str) -> list[str]:
    """The other training types whose training_config has `key` (a config switched from one type to another)."""
    owners = []
    for kind, other in METHODS.items():
        if kind == training_type:
            continue
        if key in other.own_keys:
            owners.append(kind)
            continue
        # TRL's config classes come with the package; sentence-transformers' only with the `retrieval` extra (a
        # config of another type must not need it): a type whose library is missing is not asked
        if other.retrieval and importlib.util.find_spec("sentence_transformers") is None:
            continue
        if key in trainer_arg_fields(kind):
            owners.append(kind)
    return owners


def fold_assistant_only_loss(user: dict, where: str) -> None:
    """TRL's `assistant_only_loss` said as `loss_on` (true: assistant, false: all); both, disagreeing, is refused."""
    if "assistant_only_loss" not in user:
        return
    value = user.pop("assistant_only_loss")
    mapped = "assistant" if value else "all"
    if "loss_on" in user and user["loss_on"] != mapped:
        raise LeapError(
            f"training_config sets assistant_only_loss: {value} and loss_on: {user['loss_on']}",
            where=where,
            fix="keep only `loss_on`",
        )
    user["loss_on"] = mapped


def check_values(model: LeapConfigModel, user: dict, merged: dict, where: str) -> dict:
    """The merged values: typed and range-checked against the trainer config's fields, then the rules across
    keys. `user`: the keys the config set itself (not the profile's)."""
    if user or model.dataset is not None:  # (an evaluation-only config trains nothing: no TRL import, ~8 s)
        from leap_finetune.memo import remembered

        given = dict(merged)
        merged = remembered(
            "values",
            [model.training_type, given],
            lambda: check_training_values(method_of(model).arguments_class(), given, where),
        )
    check_report_to(merged.get("report_to"), where)
    check_batch_tokens(user, merged, where)
    check_router_coefs(merged, where)
    communication.check_gradient_communication(merged, where)
    if merged.get("batch_tokens"):  # (the profile's row count and sampler, unused: not recorded as the run's)
        merged.pop("per_device_train_batch_size", None)
        merged.pop("train_sampling_strategy", None)
    check_training_rules(
        model.training_type,
        merged,
        where,
        rewards=_reward_names(model),
        benchmarks=tuple(b.name for b in model.evals.benchmarks) if model.evals else (),
    )
    if merged.get("fsdp") and model.evals is not None:
        raise LeapError(
            "benchmarks during training (evals:) run on rank 0 alone, which a model sharded by "
            "training_config.fsdp cannot do (every rank holds part of the weights)",
            where=where,
            fix="remove evals: and run `leap-finetune eval RUN_FOLDER` on the trained model, or train "
            "without fsdp (DDP)",
        )
    return merged


def check_loss_on(loss_on, where: str) -> str:
    if loss_on not in LOSS_ON:
        hint = did_you_mean(str(loss_on), LOSS_ON)
        raise LeapError(
            f"training_config.loss_on is '{loss_on}'",
            where=where,
            fix=(hint + " " if hint else "") + f"expected one of: {', '.join(LOSS_ON)}",
        )
    return loss_on


def check_kto_batch_size(training: dict, where: str) -> None:
    for key in ("per_device_train_batch_size", "per_device_eval_batch_size"):
        size = training.get(key)
        if isinstance(size, int) and size <= 1:
            raise LeapError(
                f"training_config.{key} is {size}, but KTO needs > 1: it estimates its KL term "
                "from the other rows of the same batch (each prompt paired with another row's completion)",
                where=where,
                fix=f"set {key} to 2 or more (DEFAULT_KTO uses 8); lower memory with "
                "gradient_accumulation_steps instead",
            )


def _reward_names(model: LeapConfigModel) -> tuple[str, ...]:
    """GRPO's reward names as TRL logs them (rewards/<name>/mean): each function's, and `judge`."""
    if not method_of(model).rewards or model.rewards is None:
        return ()
    from leap_finetune.rl.rewards import reward_name

    return tuple(reward_name(spec) for spec in model.rewards.funcs) + (
        ("judge",) if model.rewards.judge is not None else ()
    )
