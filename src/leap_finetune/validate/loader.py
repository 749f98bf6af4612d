"""YAML (or a dict) -> validated, resolved config.

Order: read YAML -> check top-level keys -> each block's keys -> pydantic types -> profiles (`extends`) -> check
every training / LoRA key against the library that will receive it -> resolve names and paths. The blocks are
resolved by their own modules: training.py (`training_config`), peft.py, vision.py, grpo.py, retrieval.py,
evals.py, datasets.py.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from leap_finetune.config.async_eval import check_async_eval_config
from leap_finetune.config.model_init import check_model_init_kwargs
from leap_finetune.config.paths import expand_home, local_path
from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.schema import LeapConfigModel
from leap_finetune.config.schema_dataset import dataset_shorthand
from leap_finetune.config.suggest import did_you_mean
from leap_finetune.config.yaml_io import read_yaml
from leap_finetune.errors import LeapError
from leap_finetune.memory.budget import parse_budget
from leap_finetune.methods import method_of, training_types
from leap_finetune.validate.datasets import (
    check_augment_tools,
    check_hold_out_tools,
    resolve_dataset,
    validate_dataset,
)
from leap_finetune.validate.evals import (
    check_best_benchmark,
    check_episode_benchmarks,
    check_retrieval_metrics,
    resolve_evals,
)
from leap_finetune.validate.keys import check_block_keys, check_top_level_keys, pydantic_error
from leap_finetune.validate.peft import resolve_peft
from leap_finetune.validate.retrieval import resolve_retrieval
from leap_finetune.validate.training import resolve_training

# The blocks that may not be written empty (`ray:` with nothing under it, which YAML reads as null): said as such,
# with what to write instead
NOT_EMPTY = (
    "peft_config",
    "training_config",
    "dataset",
    "evals",
    "async_eval",
    "ray",
    "slurm",
    "grpo_rollout",
    "rewards",
    "environment",
    "retrieval",
    "distill",
)


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
    from leap_finetune.config.legacy import read_original_keys

    raw, original_keys = read_original_keys(raw, where)
    model = _read_model(raw, where)
    from leap_finetune.data.chat_templates import resolve_chat_template
    from leap_finetune.models.registry import model_family, resolve_model_id
    from leap_finetune.models.vision import is_vision_model
    from leap_finetune.validate.grpo import check_picture_template, resolve_grpo, sampler_for_pictures
    from leap_finetune.validate.vision import check_vision_keys, resolve_vision

    model_id = resolve_model_id(model.model_name, base)
    vision = method_of(model).images and is_vision_model(model_id)
    check_vision_keys(model, vision, where)
    training, loss_on, resume = resolve_training(model, where, vision)
    peft, quantization = resolve_peft(model.peft_config, where, vision)
    from leap_finetune.validate.adapter import resolve_adapter

    adapter_path, peft = resolve_adapter(model, base, where, peft)
    peft = resolve_vision(model.training_type, training, peft, vision, where)  # (LoRA narrowed to the language model)
    sampler_for_pictures(model, training, vision)
    grpo_rollout, rewards = resolve_grpo(model, training, base, where)
    from leap_finetune.validate.environment import resolve_environment

    environment = resolve_environment(model, base, where, vision)
    retrieval = resolve_retrieval(model, training, where)
    from leap_finetune.validate.distill import resolve_distill

    distill = resolve_distill(model, base, where)
    check_async_eval_config(model, where)
    family = model_family(model.model_name, model_id)
    chat_template = resolve_chat_template(model.chat_template, family, base, where)
    check_picture_template(model, vision, chat_template, where)
    dataset = resolve_dataset(model, base, where)
    evals = resolve_evals(model.evals, base, where)
    _check_data_and_benchmarks(model, training, dataset, evals, vision, where)
    _resolve_model_init_kwargs(training, model, model_id, peft is not None, (quantization, vision), where)
    from leap_finetune.validate.no_effect import config_notes, qat_notes, router_notes

    user_keys = sorted(k for k in (model.training_config or {}) if k != "extends")
    notes = original_keys + config_notes(model, training, set(user_keys), model.peft_config)
    notes += router_notes(set(user_keys), model.peft_config, model_id, quantized=quantization is not None)
    notes += qat_notes(model, peft)
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
        user_training_keys=user_keys,
        config_notes=notes,
        gpu_memory=parse_budget(model.gpu_memory, f"{where}: gpu_memory") if model.gpu_memory is not None else None,
        peft=peft,
        output_dir=str(local_path(model.output_dir, base)) if model.output_dir else None,
        samples=model.samples,
        qat=check_qat(model, (vision, model_id, peft, training), quantization is not None, where),
        evals=evals,
        checkpoint=str(local_path(model.checkpoint, base)) if model.checkpoint else None,
        resume_from_checkpoint=resume if resume in (None, "latest") else _resume_path(resume, base),
        config_dir=str(base),
        ray=model.ray,
        slurm=model.slurm,
        grpo_rollout=grpo_rollout,
        rewards=rewards,
        environment=environment,
        retrieval=retrieval,
        distill=distill,
        adapter_path=adapter_path,
        async_eval=model.async_eval,
        vision=vision,
        image_processor=model.image_processor if vision else None,
    )


def _check_data_and_benchmarks(model, training: dict, dataset, evals, vision: bool, where: str) -> None:
    """What the dataset and the benchmarks must agree on with the rest of the config."""
    check_hold_out_tools(model, dataset, evals, vision, where)
    check_augment_tools(model, dataset, where)
    check_retrieval_metrics(model, evals, where)
    check_episode_benchmarks(model, evals, where)
    check_best_benchmark(model, training, evals, where)


def _resume_path(resume: str, base: Path) -> str:
    """A relative checkpoint path, from the config's folder (as every path of the config) - or, where nothing is
    there and the path exists from the shell's current folder (how a path typed next to `ls` is meant), from there."""
    at_config = local_path(resume, base)
    if at_config.exists() or Path(resume).expanduser().is_absolute():
        return str(at_config)
    at_shell = Path(resume).expanduser().resolve()
    return str(at_shell) if at_shell.exists() else str(at_config)


def _read_model(raw: dict, where: str) -> LeapConfigModel:
    """The config's mapping checked key by key (each unknown key said with its block), then read by pydantic."""
    check_top_level_keys(raw, where)
    if "dataset" in raw:
        raw = {**raw, "dataset": dataset_shorthand(raw["dataset"])}
        if not isinstance(raw["dataset"], (dict, list, type(None))):
            raise LeapError(
                f"dataset is {raw['dataset']!r}: expected a path, a mapping with a path, or a list of them",
                where=f"{where}: dataset",
                fix="write `dataset: data/train.jsonl`, or `dataset: {path: data/train.jsonl, test_size: 0.1}`",
            )
    for block in NOT_EMPTY:
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
    check_block_keys(raw, where)
    _check_training_type(raw.get("training_type", "sft"), where)
    try:
        model = LeapConfigModel.model_validate(raw)
    except ValidationError as err:
        raise pydantic_error(err, where) from None
    if model.evals is not None and not model.evals.benchmarks:  # `evals.benchmarks: []` switches benchmarks off
        model = model.model_copy(update={"evals": None})
    return model


def _resolve_model_init_kwargs(
    training: dict, model: LeapConfigModel, model_id: str, peft: bool, qlora: tuple, where: str
) -> None:
    """training_config.model_init_kwargs checked for the model it loads, with peft_config's quantization (QLoRA) in
    it (in place; left out when empty)."""
    from leap_finetune.config.quantization import add_quantization, check_quantized_run
    from leap_finetune.models.tiny import TINY_MODELS

    quantization, vision = qlora
    kwargs = check_model_init_kwargs(
        training.get("model_init_kwargs"),
        tiny=model_id in TINY_MODELS,
        training_type=model.training_type,
        peft=peft,
        where=where,
        quantization=quantization,
    )
    training["model_init_kwargs"] = add_quantization(kwargs, quantization, vision=vision, where=where)
    check_quantized_run(training, model.training_type, set(model.training_config or {}), where)
    if not training["model_init_kwargs"]:
        del training["model_init_kwargs"]


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


def check_qat(model, context: tuple, quantized: bool, where: str) -> dict | None:
    """`qat:` (models/qat.py) where it can act, and where everything the run measures goes through the rounding:
    the causal-LM training types, a dense language model (a mixture of experts' experts are 3-D weights no linear
    layer holds), a base not already 4-bit, LoRA without DoRA or a LoRA bias, rollouts on leap-finetune's sampler,
    benchmarks in the training process."""
    if model.qat is None:
        return None
    from leap_finetune.errors import LeapError
    from leap_finetune.methods import method_of
    from leap_finetune.models.architectures import supports
    from leap_finetune.models.registry import model_type

    vision, model_id, peft, training = context
    refusals = [
        (method_of(model).retrieval, f"{model.training_type} trains an encoder that is not exported to GGUF"),
        (vision, "vision-language models are not offered yet (the vision tower ships in a separate mmproj file)"),
        (quantized, "a 4-bit base (QLoRA) is already rounded to nf4, not to the target's format"),
        (supports(model_type(model_id), "moe"), "a mixture of experts' experts are 3-D weights the rounding does not "
         "reach yet (the export would round them unseen)"),
        (bool(peft and (peft.get("use_dora") or peft.get("lora_bias"))), "DoRA's magnitude and a LoRA bias are not "
         "part of the merged weight the rounding runs through"),
        (bool(training.get("use_vllm")), "vLLM's rollouts would sample from the unrounded weights: use "
         "use_vllm: false (leap-finetune's sampler rounds its copy too)"),
        (model.async_eval is not None and model.async_eval.mode != "sync", "benchmarks outside the training "
         "process read the saved, unrounded weights: use async_eval.mode: sync"),
    ]  # fmt: skip
    for refused, why in refusals:
        if refused:
            raise LeapError(f"qat: {why}", where=where, fix="remove qat:, or change what the reason names")
    return model.qat.model_dump()
