"""YAML (or a dict) -> validated, resolved config.

Order: read YAML -> check top-level keys -> pydantic types -> profiles (`extends`) -> check every
training / LoRA key against the library that will receive it -> resolve names and paths.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from pydantic import ValidationError

from leap_finetune.config import communication, profiles
from leap_finetune.config.arguments import check_training_values
from leap_finetune.config.async_eval import check_async_eval_config
from leap_finetune.config.cluster_values import (
    check_eval_sbatch_values,
    check_ray_values,
    check_slurm_values,
)
from leap_finetune.config.lora import check_lora_values
from leap_finetune.config.model_init import check_model_init_kwargs
from leap_finetune.config.paths import expand_home, local_path
from leap_finetune.config.precision import check_optimizer_precision
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.rules import check_batch_tokens, check_training_rules
from leap_finetune.config.schema import (
    GENERATION_METRICS,
    LOGPROB_METRICS,
    EvalsConfig,
    LeapConfigModel,
    dataset_shorthand,
)
from leap_finetune.config.suggest import did_you_mean, other_type_key, unknown_key_fix
from leap_finetune.config.trackers import check_report_to
from leap_finetune.config.yaml_io import read_yaml
from leap_finetune.errors import LeapError
from leap_finetune.methods import METHODS, VISION_KEYS, method_of, training_types
from leap_finetune.validate.datasets import (
    check_hold_out_tools,
    resolve_data_path,
    resolve_dataset,
    validate_dataset,
)
from leap_finetune.validate.keys import check_keys, check_top_level_keys, pydantic_error, trainer_arg_fields

LOSS_ON = ("assistant", "all", "final_assistant")

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


def load_config(
    source: str | Path | dict, *, base_dir: Path | None = None, overrides: list[str] | None = None
) -> ResolvedConfig:
    """Read and validate a config from a YAML path or a dict; relative paths resolve against the
    YAML file's folder (or `base_dir`, default the current folder, for a dict). `overrides` are the
    command line's `--set KEY=VALUE`, applied before anything is checked."""
    if isinstance(source, dict):
        raw, config_path = dict(source), None
        base = (base_dir or Path.cwd()).resolve()
    else:
        config_path = expand_home(str(source)).resolve()
        raw = read_yaml(config_path)
        base = config_path.parent
    where = str(config_path) if config_path else "config"
    if overrides:
        from leap_finetune.config.overrides import apply_overrides

        raw = apply_overrides(raw, overrides)
        import shlex

        where += " (with " + " ".join(f"--set {shlex.quote(o)}" for o in overrides) + ")"  # (as typed in a shell)
        return _load(raw, config_path, base, where).model_copy(update={"overrides": list(overrides)})
    return _load(raw, config_path, base, where)


def _load(raw: dict, config_path: Path | None, base: Path, where: str) -> ResolvedConfig:

    check_top_level_keys(raw, where)
    if "dataset" in raw:
        raw = {**raw, "dataset": dataset_shorthand(raw["dataset"])}
        if not isinstance(raw["dataset"], (dict, list, type(None))):
            raise LeapError(
                f"dataset is {raw['dataset']!r}: expected a path, a mapping with a path, or a list of them",
                where=f"{where}: dataset",
                fix="write `dataset: data/train.jsonl`, or `dataset: {path: data/train.jsonl, test_size: 0.1}`",
            )
    for block in (
        "peft_config",
        "training_config",
        "dataset",
        "evals",
        "async_eval",
        "ray",
        "slurm",
        "grpo_rollout",
        "rewards",
        "retrieval",
    ):
        if block in raw and raw[block] is None:
            raise LeapError(
                f"'{block}:' is empty",
                where=where,
                fix={
                    "peft_config": "for LoRA with the defaults write `peft_config: {extends: DEFAULT_LORA}`; for a full "
                    "fine-tune remove the key"
                }.get(block, f"give {block} its keys, or remove it"),
            )
    if isinstance(raw.get("dataset"), (dict, list)):
        raw = {**raw, "dataset": validate_dataset(raw["dataset"], where)}
    if isinstance(raw.get("ray"), dict):
        from leap_finetune.config.schema import RayConfig

        check_keys(raw["ray"], RayConfig.model_fields, where, "ray")
        check_ray_values(raw["ray"], where)
    if isinstance(raw.get("slurm"), dict):
        from leap_finetune.config.schema import SlurmConfig

        check_keys(raw["slurm"], SlurmConfig.model_fields, where, "slurm")
        check_slurm_values(raw["slurm"], where)
    if isinstance(raw.get("async_eval"), dict) and isinstance(raw["async_eval"].get("sbatch"), dict):
        check_eval_sbatch_values(raw["async_eval"]["sbatch"], where)
    if isinstance(raw.get("grpo_rollout"), dict):
        from leap_finetune.config.schema import GrpoRolloutConfig

        check_keys(raw["grpo_rollout"], GrpoRolloutConfig.model_fields, where, "grpo_rollout")
    if isinstance(raw.get("rewards"), dict):
        from leap_finetune.config.schema import JudgeConfig, RewardsConfig

        check_keys(raw["rewards"], RewardsConfig.model_fields, where, "rewards")
        if isinstance(raw["rewards"].get("judge"), dict):
            check_keys(raw["rewards"]["judge"], JudgeConfig.model_fields, where, "rewards.judge")
    if isinstance(raw.get("retrieval"), dict):
        from leap_finetune.config.schema import RetrievalConfig, RetrievalPrompts

        check_keys(raw["retrieval"], RetrievalConfig.model_fields, where, "retrieval")
        if isinstance(raw["retrieval"].get("prompts"), dict):
            check_keys(raw["retrieval"]["prompts"], RetrievalPrompts.model_fields, where, "retrieval.prompts")
    if isinstance(raw.get("async_eval"), dict):
        from leap_finetune.config.schema import AsyncEvalConfig

        check_keys(raw["async_eval"], AsyncEvalConfig.model_fields, where, "async_eval")
        for key in ("sbatch", "reserved", "failure"):
            if isinstance(raw["async_eval"].get(key), dict):
                check_keys(
                    raw["async_eval"][key],
                    AsyncEvalConfig.model_fields[key].annotation.model_fields,
                    where,
                    f"async_eval.{key}",
                )
    if isinstance(raw.get("image_processor"), dict):
        from leap_finetune.config.schema import ImageProcessorConfig

        check_keys(raw["image_processor"], ImageProcessorConfig.model_fields, where, "image_processor")
    if isinstance(raw.get("evals"), dict):
        from leap_finetune.config.schema import BenchmarkConfig

        check_keys(raw["evals"], EvalsConfig.model_fields, where, "evals")
        for bench in raw["evals"].get("benchmarks") or []:
            if isinstance(bench, dict):
                check_keys(bench, BenchmarkConfig.model_fields, where, "evals.benchmarks[]")
    _check_training_type(raw.get("training_type", "sft"), where)
    try:
        model = LeapConfigModel.model_validate(raw)
    except ValidationError as err:
        raise pydantic_error(err, where) from None
    if model.evals is not None and not model.evals.benchmarks:  # `evals.benchmarks: []` switches benchmarks off
        model = model.model_copy(update={"evals": None})

    from leap_finetune.models.registry import resolve_model_id
    from leap_finetune.models.vision import is_vision_model
    from leap_finetune.validate.vision import check_vision_keys, resolve_vision

    model_id = resolve_model_id(model.model_name, base)
    vision = method_of(model).images and is_vision_model(model_id)
    check_vision_keys(model, vision, where)
    training, loss_on, resume = _resolve_training(model, where, vision)
    peft = _resolve_peft(model.peft_config, where, vision)
    peft = resolve_vision(model.training_type, training, peft, vision, where)
    from leap_finetune.validate.grpo import resolve_grpo

    grpo_rollout, rewards = resolve_grpo(model, training, base, where)
    retrieval = _resolve_retrieval(model, training, where)
    check_async_eval_config(model, where)

    from leap_finetune.data.chat_templates import resolve_chat_template
    from leap_finetune.models.registry import model_family
    from leap_finetune.models.tiny import TINY_MODELS

    family = model_family(model.model_name, model_id)
    chat_template = resolve_chat_template(model.chat_template, family, base, where)

    dataset = resolve_dataset(model, base, where)
    evals = _resolve_evals(model.evals, base, where)
    check_hold_out_tools(model, dataset, evals, vision, where)
    if not method_of(model).retrieval:
        for index, bench in enumerate(evals.benchmarks if evals is not None else []):
            if bench.metric == "retrieval":
                raise LeapError(
                    f"benchmark '{bench.name}' has metric retrieval, which scores embedding and ColBERT "
                    f"models, and training_type is {model.training_type}",
                    where=f"{where}: evals.benchmarks[{index}].metric",
                    fix="use a generation or log-prob metric (docs/evaluation.md), or training_type: "
                    "embedding / colbert",
                )

    output_dir = str(local_path(model.output_dir, base)) if model.output_dir else None
    training["model_init_kwargs"] = check_model_init_kwargs(
        training.get("model_init_kwargs"),
        tiny=model_id in TINY_MODELS,
        training_type=model.training_type,
        peft=peft is not None,
        where=where,
    )
    if not training["model_init_kwargs"]:
        del training["model_init_kwargs"]
    return ResolvedConfig(
        config_path=str(config_path) if config_path else None,
        project_name=model.project_name,
        training_type=model.training_type,
        model_name=model.model_name,
        model_id=model_id,
        model_family=family,
        chat_template=chat_template,
        loss_on=loss_on,
        dataset=dataset,
        training=training,
        peft=peft,
        output_dir=output_dir,
        samples=model.samples,
        evals=evals,
        checkpoint=str(local_path(model.checkpoint, base)) if model.checkpoint else None,
        resume_from_checkpoint=resume if resume in (None, "latest") else str(local_path(resume, base)),
        config_dir=str(base),
        ray=model.ray,
        slurm=model.slurm,
        grpo_rollout=grpo_rollout,
        rewards=rewards,
        retrieval=retrieval,
        async_eval=model.async_eval,
        vision=vision,
        image_processor=model.image_processor if vision else None,
    )


def _resolve_retrieval(model: LeapConfigModel, training: dict, where: str):
    from leap_finetune.config.schema import RetrievalConfig

    if not method_of(model).retrieval:
        if model.retrieval is not None:
            raise LeapError(
                f"'retrieval:' applies to training_type embedding or colbert, and training_type is "
                f"{model.training_type}",
                where=where,
                fix="remove retrieval, or set training_type: embedding",
            )
        return None
    import importlib.util

    from leap_finetune.models.tiny import TINY_MODELS

    if importlib.util.find_spec("sentence_transformers") is None:
        raise LeapError(
            f"training_type {model.training_type} trains with sentence-transformers, which is not installed",
            where=f"{where}: training_type",
            fix="pip install 'leap-finetune[retrieval]'",
        )
    if model.model_name in TINY_MODELS and model.model_name not in ("tiny-lfm2", "tiny-lfm2.5"):
        raise LeapError(
            f"{model.model_name} is not a text model: it cannot be a {model.training_type} backbone",
            where=f"{where}: model_name",
            fix="use tiny-lfm2, an LFM2 model, or a sentence-transformers "
            "model or encoder folder (e.g. all-MiniLM-L6-v2)",
        )
    for index, bench in enumerate(model.evals.benchmarks if model.evals is not None else []):
        if bench.metric != "retrieval":
            raise LeapError(
                f"benchmark '{bench.name}' has metric {bench.metric}: an {model.training_type} model "
                "generates no text, so only retrieval benchmarks apply",
                where=f"{where}: evals.benchmarks[{index}].metric",
                fix="use metric: retrieval with a folder of corpus.jsonl, queries.jsonl and qrels/test.tsv "
                '(docs/retrieval.md, "Retrieval benchmarks"); the held-out rows are scored anyway',
            )
    if training.get("fsdp"):
        raise LeapError(
            f"FSDP does not apply to {model.training_type} training: its workers each "
            "hold the whole model (DDP) and gather the documents of every worker",
            where=f"{where}: training_config.fsdp",
            fix="remove fsdp (a retrieval model fits on each GPU; "
            "for a large one use LoRA with peft_config, or a smaller per_device_train_batch_size with "
            "retrieval.loss: cached_mnrl)",
        )
    for key in ("modules_to_save", "trainable_token_indices"):
        if (model.peft_config or {}).get(key):
            raise LeapError(
                f"peft_config.{key} does not apply to {model.training_type} training: the LoRA layers are "
                "merged into the saved model, and these modules would not be",
                where=f"{where}: peft_config.{key}",
                fix=f"remove {key} (a ColBERT projection or Dense layer after the backbone is trained fully anyway)",
            )
    accumulation = training.get("gradient_accumulation_steps", 1)
    if accumulation > 1:
        raise LeapError(
            f"{accumulation} accumulation steps: with in-batch negatives, "
            "accumulated small batches are not one large batch (each query only sees the documents of "
            "its own small batch)",
            where=f"{where}: training_config.gradient_accumulation_steps",
            fix="set it to 1, and for a large effective batch use retrieval.loss: cached_mnrl with a large "
            "per_device_train_batch_size (GradCache keeps memory at mini_batch_size rows)",
        )
    return model.retrieval or RetrievalConfig()


def _resolve_evals(evals: EvalsConfig | None, base: Path, where: str) -> EvalsConfig | None:
    if evals is None:
        return None
    evals = evals.model_copy(deep=True)
    names = set()
    for index, bench in enumerate(evals.benchmarks):
        here = f"{where}: evals.benchmarks[{index}]"
        if bench.name in names:
            raise LeapError(
                f"two benchmarks are named '{bench.name}'", where=here, fix="give each benchmark its own name"
            )
        names.add(bench.name)
        bench.path = resolve_data_path(bench.path, base)
        if "::" in bench.metric:
            file, _, function = bench.metric.partition("::")
            path = local_path(file, base)
            if not path.is_file() or not function.isidentifier():
                raise LeapError(
                    f"custom metric '{bench.metric}': "
                    + ("file not found" if not path.is_file() else "bad function name"),
                    where=f"{here}.metric",
                    fix="write it as ./my_metrics.py::function_name (the path relative to the config file)",
                )
            bench.metric = f"{path}::{function}"
        elif bench.metric == "retrieval":
            bench.path = str(local_path(bench.path, base))  # a folder (BEIR layout), never a Hub id
        elif bench.metric not in GENERATION_METRICS + LOGPROB_METRICS:
            hint = did_you_mean(bench.metric, GENERATION_METRICS + LOGPROB_METRICS + ("retrieval",))
            raise LeapError(
                f"unknown metric '{bench.metric}'",
                where=f"{here}.metric",
                fix=(hint + " " if hint else "")
                + "generation metrics: "
                + ", ".join(GENERATION_METRICS)
                + "; log-prob multiple choice: logprob_mcq; or ./file.py::function; for embedding/colbert models: "
                "retrieval",
            )
    return evals


def require_dataset(resolved: ResolvedConfig) -> None:
    if resolved.dataset is None:
        raise LeapError(
            "required key 'dataset' is missing (training needs data)",
            where=resolved.config_path or "config",
            fix="add a dataset: block with a path; for evaluation alone use `leap-finetune eval`",
        )


def _check_training_type(value, where: str) -> None:
    types = training_types()  # (every registered type is supported in this version)
    if value in types:
        return
    hint = did_you_mean(str(value), types)
    raise LeapError(
        f"unknown training_type '{value}'",
        where=f"{where}: training_type",
        fix=(hint + " " if hint else "") + f"expected one of: {', '.join(types)}",
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


def _resolve_training(model: LeapConfigModel, where: str, vision: bool = False) -> tuple[dict, str, str | None]:
    user = dict(model.training_config)
    method = method_of(model)
    default_profile = method.vision_profile if vision else method.profile
    profile_name = user.pop("extends", None) or default_profile
    if profile_name not in profiles.TRAINING_PROFILES:
        raise LeapError(
            f"unknown profile '{profile_name}' in training_config.extends",
            where=where,
            fix=unknown_key_fix(str(profile_name), profiles.TRAINING_PROFILES),
        )
    own_profile = method.profile
    if profile_name == method.vision_profile and profile_name != own_profile and not vision:
        raise LeapError(
            f"training_config.extends is {profile_name}, the profile for vision-language models, and "
            f"'{model.model_name}' is a text model",
            where=where,
            fix=f"use extends: {own_profile} (or leave extends out)",
        )
    if profile_name not in (own_profile, method.vision_profile):
        raise LeapError(
            f"training_config.extends is {profile_name}, a profile for another training type than "
            f"{model.training_type}",
            where=where,
            fix=f"use extends: {own_profile} (or leave extends out)",
        )
    own_keys = set(method.own_keys) | (set(VISION_KEYS) if method.images else set())
    allowed = (
        (trainer_arg_fields(model.training_type) if user else set())
        | own_keys
        | {"resume_allow_changes", communication.KEY}
    )
    for key in user:
        if key in MANAGED_TRAINING_KEYS:
            raise LeapError(
                f"training_config.{key} is decided by leap-finetune", where=where, fix=MANAGED_TRAINING_KEYS[key]
            )
        if key == "loss_on" and "loss_on" not in own_keys:
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
        if key in ("compile_layers", "padding_free") and key in own_keys and not isinstance(user[key], bool):
            raise LeapError(f"training_config.{key} is {user[key]!r}", where=where, fix="use true or false")
        if key == "optimizer_precision" and key in own_keys:
            check_optimizer_precision(user, where, lora=bool(model.peft_config))
        if key not in allowed and key != "assistant_only_loss":
            owners = _types_with_key(key, model.training_type)
            if owners:
                message, fix = other_type_key(key, model.training_type, owners)
                raise LeapError(message, where=where, fix=fix)
            owner = (
                "sentence-transformers' training arguments"
                if method_of(model).retrieval
                else f"TRL's {model.training_type.upper()}Config"
            )
            raise LeapError(
                f"unknown key '{key}' in training_config (not a leap-finetune key, nor one of {owner})",
                where=where,
                fix=unknown_key_fix(key, allowed),
            )
    if "assistant_only_loss" in user:
        value = user.pop("assistant_only_loss")
        mapped = "assistant" if value else "all"
        if "loss_on" in user and user["loss_on"] != mapped:
            raise LeapError(
                f"training_config sets assistant_only_loss: {value} and loss_on: {user['loss_on']}",
                where=where,
                fix="keep only `loss_on`",
            )
        user["loss_on"] = mapped
    merged = profiles.training_profile(profile_name)
    merged.update(user)
    if user or model.dataset is not None:  # (an evaluation-only config trains nothing: no TRL import, ~8 s)
        merged = check_training_values(method_of(model).arguments_class(), merged, where)
    check_report_to(merged.get("report_to"), where)
    check_batch_tokens(user, merged, where)
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
    loss_on = merged.pop("loss_on", "assistant")
    if loss_on not in LOSS_ON:
        raise LeapError(
            f"training_config.loss_on is '{loss_on}'",
            where=where,
            fix=(did_you_mean(str(loss_on), LOSS_ON) + " " if did_you_mean(str(loss_on), LOSS_ON) else "")
            + f"expected one of: {', '.join(LOSS_ON)}",
        )
    if method_of(model).kl_pairs:
        _check_kto_batch_size(merged, where)
    resume = merged.pop("resume_from_checkpoint", None)
    if resume is not None and not isinstance(resume, str):
        raise LeapError(
            "training_config.resume_from_checkpoint must be 'latest' or a checkpoint folder",
            where=where,
            fix="resume_from_checkpoint: latest",
        )
    _check_allow_changes(merged, where, model.training_type)
    return merged, loss_on, resume


def _check_allow_changes(training: dict, where: str, training_type: str) -> None:
    """`resume_allow_changes`: a list of training_config keys (or `rewards`), or [all]."""
    from leap_finetune.config.resume import RESUME_ALLOWABLE, RESUME_KEEPS_TRAINING

    value = training.get("resume_allow_changes")
    if value is None:
        training.pop("resume_allow_changes", None)
        return
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise LeapError(
            f"training_config.resume_allow_changes is {value!r}",
            where=where,
            fix="give a list of training_config keys, e.g. resume_allow_changes: [learning_rate], or [all]",
        )
    value = list(dict.fromkeys(value))
    fixed = [
        v
        for v in value
        if v in ("dataset", "model_name", "training_type", "chat_template", "peft_config", "retrieval", "loss_on")
    ]
    if fixed:
        raise LeapError(
            f"training_config.resume_allow_changes lists {', '.join(fixed)}: a resume never changes the "
            "data, the model or what is trained",
            where=where,
            fix="remove it; to train on other data or another model, start a new run",
        )
    never = [v for v in value if v in RESUME_KEEPS_TRAINING]
    if never:
        raise LeapError(
            f"training_config.resume_allow_changes lists {', '.join(never)}, which a resume cannot change "
            "(the data each step reads, the model's shape or the optimizer the checkpoint holds)",
            where=where,
            fix="remove it, or start a new run",
        )
    if "all" in value and len(value) > 1:
        raise LeapError(
            "training_config.resume_allow_changes lists `all` with other keys",
            where=where,
            fix="give either [all] or the keys",
        )
    known = set(training) | set(RESUME_ALLOWABLE) | {"all"}
    fields = trainer_arg_fields(training_type)
    unknown = [v for v in value if v not in known and v not in fields]
    if unknown:
        raise LeapError(
            f"training_config.resume_allow_changes lists {', '.join(unknown)}, not a training_config key",
            where=where,
            fix=unknown_key_fix(unknown[0], sorted(fields | set(RESUME_ALLOWABLE))),
        )
    training["resume_allow_changes"] = value


def _check_kto_batch_size(training: dict, where: str) -> None:
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


def _resolve_peft(peft_config: dict | None, where: str, vision: bool = False) -> dict | None:
    if peft_config is None:
        return None
    user = dict(peft_config)
    profile_name = user.pop("extends", None) or ("DEFAULT_VLM_LORA" if vision else "DEFAULT_LORA")
    if profile_name not in profiles.PEFT_PROFILES:
        raise LeapError(
            f"unknown profile '{profile_name}' in peft_config.extends",
            where=where,
            fix=unknown_key_fix(str(profile_name), profiles.PEFT_PROFILES),
        )
    from peft import LoraConfig

    allowed = {f.name for f in dataclasses.fields(LoraConfig) if f.init} | {"use_peft"}
    for key in user:
        if key not in allowed:
            raise LeapError(
                f"unknown key '{key}' in peft_config (not an option of peft's LoraConfig)",
                where=where,
                fix=unknown_key_fix(key, allowed),
            )
    merged = profiles.peft_profile(profile_name)
    merged.update(user)
    use_peft = merged.pop("use_peft", True)
    if not isinstance(use_peft, bool):
        raise LeapError(
            f"peft_config.use_peft is {use_peft!r}: expected true or false",
            where=where,
            fix="use_peft: true (LoRA) or false (a full fine-tune)",
        )
    return check_lora_values(merged, where) if use_peft else None


def _reward_names(model) -> tuple[str, ...]:
    """GRPO's reward names as TRL logs them (rewards/<name>/mean): each function's, and `judge`."""
    if not method_of(model).rewards or model.rewards is None:
        return ()
    from leap_finetune.rl.rewards import reward_name

    return tuple(reward_name(spec) for spec in model.rewards.funcs) + (
        ("judge",) if model.rewards.judge is not None else ()
    )
