"""GRPO's blocks checked at `validate`: `rewards:` (built-in and custom functions, weights, the judge)
and `grpo_rollout:` together with the rollout keys of `training_config` (use_vllm, vllm_mode, servers).

What needs vLLM installed is checked by `check_rollout_engine`, called by validate and run but not by
`plan`: a plan can be made anywhere.
"""

from __future__ import annotations

import importlib.util
import math
import os
import string
from pathlib import Path

from leap_finetune.config.numbers import plain, shown
from leap_finetune.config.schema import LeapConfigModel
from leap_finetune.config.schema_grpo import GrpoRolloutConfig, RewardsConfig
from leap_finetune.errors import LeapError
from leap_finetune.methods import method_of

TEMPLATE_FIELDS = {"prompt", "completion", "solution", "min_score", "max_score"}


def resolve_grpo(
    model: LeapConfigModel, training: dict, base: Path, where: str
) -> tuple[GrpoRolloutConfig | None, RewardsConfig | None]:
    if not method_of(model).rewards:
        for block, value in (("grpo_rollout", model.grpo_rollout), ("rewards", model.rewards)):
            if value is not None:
                raise LeapError(
                    f"'{block}:' applies to training_type: grpo, and training_type is {model.training_type}",
                    where=where,
                    fix=f"remove {block}, or set training_type: grpo",
                )
        return None, None
    rewards = _resolve_rewards(model.rewards, base, where)
    rollout = model.grpo_rollout or GrpoRolloutConfig()
    _check_rollout(rollout, rewards, training, where)
    return rollout, rewards


def _resolve_rewards(rewards: RewardsConfig | None, base: Path, where: str) -> RewardsConfig:
    from leap_finetune.rl.rewards import check_reward_spec

    example = "rewards: [accuracy]   (or ./my_rewards.py::my_reward, or a judge: {judge: {model: ..., base_url: ...}})"
    if rewards is None:
        raise LeapError(
            "training_type grpo needs rewards: the functions that score each completion",
            where=where,
            fix=f"add e.g. {example}",
        )
    if not rewards.funcs and rewards.judge is None:
        raise LeapError("rewards has no function and no judge", where=where, fix=f"add e.g. {example}")
    funcs = []
    for index, spec in enumerate(rewards.funcs):
        if isinstance(spec, str) and "::" in spec:
            file, _, name = spec.partition("::")
            spec = f"{_absolute(file, base)}::{name}"
        elif isinstance(spec, dict) and isinstance(spec.get("name"), str) and "::" in spec["name"]:
            file, _, name = spec["name"].partition("::")
            spec = {**spec, "name": f"{_absolute(file, base)}::{name}"}
        checked = check_reward_spec(spec, index, where)
        if checked in funcs:  # (the same function twice: its weight doubled, and its metrics logged under one name)
            raise LeapError(
                f"rewards.funcs[{index}] repeats rewards.funcs[{funcs.index(checked)}] "
                f"({checked['name'] if isinstance(checked, dict) else checked})",
                where=where,
                fix="list each reward once; to weigh one more than the others, set rewards.weights "
                "(e.g. weights: [2, 1])",
            )
        funcs.append(checked)
    _check_weights(rewards, where)
    if rewards.judge is not None:
        _check_judge(rewards.judge, where)
    return rewards.model_copy(update={"funcs": funcs})


def reward_weights(rewards: RewardsConfig) -> list[float]:
    """The weight of each reward, in TRL's order: the functions, then the judge."""
    if rewards.weights is not None:
        return list(rewards.weights)
    return [1.0] * len(rewards.funcs) + ([rewards.judge.weight] if rewards.judge is not None else [])


def _check_weights(rewards: RewardsConfig, where: str) -> None:
    count = len(rewards.funcs) + (1 if rewards.judge is not None else 0)
    listed = f"{len(rewards.funcs)} function(s)" + (" and the judge" if rewards.judge is not None else "")
    if rewards.weights is not None:
        if len(rewards.weights) != count:
            raise LeapError(
                f"rewards.weights has {len(rewards.weights)} value(s), but there are {count} rewards ({listed})",
                where=where,
                fix=f"give {count} weights, in the order of funcs then the judge, or leave weights out (1 each)",
            )
        infinite = next((i for i, w in enumerate(rewards.weights) if not math.isfinite(w)), None)
        if infinite is not None:
            raise LeapError(
                f"rewards.weights[{infinite}] is {shown(rewards.weights[infinite])}: expected a finite number",
                where=where,
                fix="give every reward a finite weight (1 is the default)",
            )
        if rewards.judge is not None and "weight" in rewards.judge.model_fields_set:
            raise LeapError(
                "the judge's weight is given twice: rewards.judge.weight and the last of rewards.weights",
                where=where,
                fix="keep one (rewards.weights lists the judge's weight after the functions')",
            )
    weights = reward_weights(rewards)
    if weights and not any(weights):
        given = (
            f"rewards.weights: [{', '.join(plain(w) for w in weights)}]"
            if rewards.weights is not None
            else "rewards.judge.weight: 0, the only reward"
        )
        raise LeapError(
            f"every reward's weight is 0 ({given}): every completion's weighted reward would be 0, "
            "and GRPO would learn nothing (a completion's advantage is its reward minus its group's mean)",
            where=where,
            fix="give at least one reward a non-zero weight; a weight of 0 for one reward is fine when "
            "another is not 0 (it is then computed and logged, not trained on)",
        )


def _absolute(file: str, base: Path) -> str:
    path = Path(os.path.expanduser(file))
    return str(path if path.is_absolute() else (base / path).resolve())


def _check_judge(judge, where: str) -> None:
    if judge.base_url is not None and not judge.base_url.startswith(("http://", "https://")):
        raise LeapError(
            f"rewards.judge.base_url is {judge.base_url!r}: expected an http:// or https:// URL",
            where=where,
            fix=f"write e.g. http://{judge.base_url.split('://')[-1]}",
        )
    if judge.max_score <= judge.min_score:
        raise LeapError(
            f"rewards.judge.max_score ({judge.max_score}) must be above min_score ({judge.min_score})",
            where=where,
            fix="e.g. min_score: 0, max_score: 10",
        )
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(judge.prompt_template) if f is not None}
    except ValueError as err:
        raise LeapError(
            f"rewards.judge.prompt_template does not parse: {err}",
            where=where,
            fix="write {{ and }} for literal braces",
        ) from None
    unknown = sorted(n for n in names if n not in TEMPLATE_FIELDS)
    if unknown:
        raise LeapError(
            f"rewards.judge.prompt_template names {', '.join('{' + n + '}' for n in unknown)}",
            where=where,
            fix="it may use {prompt}, {completion}, {solution}, {min_score}, {max_score} "
            "(write {{ and }} for literal braces)",
        )
    if "completion" not in names:
        raise LeapError(
            "rewards.judge.prompt_template has no {completion}: the judge would not see the answer",
            where=where,
            fix="add {completion} (and usually {prompt} and {solution})",
        )
    if judge.api_key_env and not os.environ.get(judge.api_key_env):
        raise LeapError(
            f"rewards.judge.api_key_env names {judge.api_key_env}, which is not set",
            where=where,
            fix=f"export {judge.api_key_env}=... before running (the key never goes in the config)",
        )
    if importlib.util.find_spec("openai") is None:
        raise LeapError(
            "rewards.judge talks to its server through the `openai` client, which is not installed",
            where=where,
            fix="pip install 'leap-finetune[grpo]'",
        )


def _check_rollout(rollout: GrpoRolloutConfig, rewards: RewardsConfig, training: dict, where: str) -> None:
    cache = training.get("cache_implementation")
    if cache is not None:
        from transformers.generation.configuration_utils import ALL_CACHE_IMPLEMENTATIONS

        if cache not in ALL_CACHE_IMPLEMENTATIONS:  # TRL's config takes any text; its generation config would not
            raise LeapError(
                f"training_config.cache_implementation is {cache!r}",
                where=where,
                fix="use static (DEFAULT_GRPO: compiled decoding on a GPU), null (TRL's dynamic cache), or "
                f"one of: {', '.join(ALL_CACHE_IMPLEMENTATIONS)}",
            )
    mode = training.get("vllm_mode", "colocate")
    use_vllm = bool(training.get("use_vllm"))
    external = training.get("vllm_server_base_url")
    if rollout.server_gpus and not (use_vllm and mode == "server"):
        raise LeapError(
            f"grpo_rollout.server_gpus is {rollout.server_gpus}, but no rollout server is started "
            f"(use_vllm: {str(use_vllm).lower()}, vllm_mode: {mode})",
            where=where,
            fix="set vllm_mode: server (with use_vllm: true) to use them, or server_gpus: 0",
        )
    if use_vllm and mode == "server":
        if external and rollout.server_gpus:
            raise LeapError(
                "training_config.vllm_server_base_url points at an external rollout server, and "
                f"grpo_rollout.server_gpus ({rollout.server_gpus}) would start a local one",
                where=where,
                fix="keep one: remove vllm_server_base_url, or set server_gpus: 0",
            )
        if not external and not rollout.server_gpus:
            raise LeapError(
                "vllm_mode: server needs a rollout server: grpo_rollout.server_gpus is 0 and "
                "training_config.vllm_server_base_url is not set",
                where=where,
                fix="set grpo_rollout.server_gpus: 1 (a local `trl vllm-serve`), or vllm_server_base_url: "
                "http://host:8000 for a server you run, or vllm_mode: colocate",
            )
    judge = rewards.judge
    if (
        judge is not None
        and judge.base_url is None
        and use_vllm
        and mode == "server"
        and not external
        and rollout.judge_port == int(training.get("vllm_server_port", 8000))
    ):
        raise LeapError(
            f"the local judge and the rollout server would both listen on port {rollout.judge_port}",
            where=where,
            fix="set grpo_rollout.judge_port or training_config.vllm_server_port to another port",
        )
    if rollout.judge_gpus and (judge is None or judge.base_url is not None):
        raise LeapError(
            f"grpo_rollout.judge_gpus is {rollout.judge_gpus}, but no local judge is configured "
            "(rewards.judge without base_url)",
            where=where,
            fix="set judge_gpus: 0, or configure rewards.judge without base_url",
        )


def check_generation_batch(resolved, workers: int) -> None:
    """TRL generates num_generations completions per prompt and needs them to fill whole global batches."""
    t = resolved.training
    if not method_of(resolved).rewards:
        return
    generations = t.get("num_generations", 8)
    per_generation = t.get("steps_per_generation") or t.get("gradient_accumulation_steps", 1)
    batch = t.get("generation_batch_size") or t.get("per_device_train_batch_size", 8) * per_generation * workers
    if batch % generations:
        raise LeapError(
            f"a generation batch is {batch} completions (per_device_train_batch_size x steps_per_generation "
            f"x {workers} worker(s), or generation_batch_size), not a multiple of num_generations "
            f"({generations}): each prompt's completions must fill whole batches",
            where=resolved.config_path or "config",
            fix=f"make the batch a multiple of {generations}, or change num_generations",
        )


def check_rollout_engine(resolved) -> None:
    """What `run` needs installed: vLLM for use_vllm (and so for the rollout server), a server program for
    a local judge (validate and run; `plan` only plans, so the layout of servers can be shown anywhere)."""
    if not method_of(resolved).rewards:
        return
    if resolved.training.get("use_vllm") and resolved.vision:
        # (measured 2026-12-07, vLLM 0.26 colocate through TRL 1.16: the engine refused the vision tower's weights
        # under transformers 5's flat names. The sync now sends the published names (recipes/grpo_images.py) and
        # LFM2-VL is saved in the published layout (models/lfm2_keys.py); the refusal stays until a GPU run shows the
        # rollouts work - bench/vl_grpo.py --engines vllm, bench/NOTES.md)
        raise LeapError(
            "training_config.use_vllm is true, and GRPO on a vision-language model runs its rollouts on "
            "leap-finetune's sampler only (vLLM rollouts with pictures are not supported yet: not yet verified on "
            "a GPU with vLLM 0.26)",
            where=f"{resolved.config_path or 'config'}: training_config.use_vllm",
            fix="set use_vllm: false (the sampler puts the pixels in the prompt's forward: measured 5.6x TRL's "
            "generation at LFM2-VL-450M and 3.8x at 1.6B on an H100, docs/vision.md)",
        )
    if resolved.training.get("use_vllm") and importlib.util.find_spec("vllm") is None:
        raise LeapError(
            "training_config.use_vllm is true (DEFAULT_GRPO's rollouts run on vLLM), and vLLM is not installed",
            where=resolved.config_path or "config",
            fix="pip install 'leap-finetune[vllm]' on a CUDA machine, or set use_vllm: false (rollouts "
            "through leap-finetune's sampler: measured 3-6x faster than vLLM colocate on one GPU for LFM2 "
            "up to 1.2B, docs/grpo.md, 'Which engine is faster')",
        )
    t = resolved.training
    paged = next((k for k in ("use_transformers_continuous_batching", "use_transformers_paged") if t.get(k)), None)
    if paged and not t.get("use_vllm"):
        from leap_finetune.models.architectures import architecture
        from leap_finetune.models.registry import model_type

        kind = model_type(resolved.model_id)
        if architecture(kind) is not None and not architecture(kind).continuous_batching:
            raise LeapError(
                f"training_config.{paged}: transformers' continuous batching has no cache for LFM2's "
                f"convolution layers (model type {kind}): the first rollout would fail",
                where=resolved.config_path or "config",
                fix=f"remove {paged}: DEFAULT_GRPO's static cache with a compiled decoding step is the "
                "fast path for LFM2 (bench/RESULTS.md), or use vLLM (use_vllm: true)",
            )
    rollout = resolved.grpo_rollout
    judge = resolved.rewards.judge if resolved.rewards is not None else None
    if judge is None or judge.base_url is not None:
        return
    vllm_judge = rollout.judge_gpus and importlib.util.find_spec("vllm") is not None
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if not vllm_judge and missing:
        where = (
            f"on {rollout.judge_gpus} GPU(s) with `transformers serve` (vLLM is not installed)"
            if rollout.judge_gpus
            else "on CPU (judge_gpus: 0) with `transformers serve`"
        )
        raise LeapError(
            f"rewards.judge has no base_url, so the driver runs the judge {where}, which needs {' and '.join(missing)}",
            where=resolved.config_path or "config",
            fix="pip install 'leap-finetune[grpo]' (transformers' serving extra), or install vLLM for a GPU "
            "judge, or give rewards.judge.base_url of a running server",
        )


def check_picture_template(model, vision: bool, chat_template: str, where: str) -> None:
    """GRPO on pictures: TRL renders each prompt's image parts through the chat template, and LFM2's text templates
    (lfm2, lfm2-v1) write a list of parts as JSON - the pictures would never reach the model."""
    if not (vision and method_of(model).rewards and chat_template in ("lfm2", "lfm2-v1")):
        return
    raise LeapError(
        f"GRPO on pictures renders the prompts' image parts with the chat template, and '{chat_template}' (LFM2's "
        "text template) does not render image parts",
        where=f"{where}: chat_template",
        fix="set chat_template: model (the vision-language model's own template) or lfm2.5",
    )


def sampler_for_pictures(model, training: dict, vision: bool) -> None:
    """GRPO on a vision-language model: DEFAULT_GRPO's `use_vllm: true` becomes the sampler (vLLM does not take the
    pictures here yet); a `use_vllm: true` the user wrote is refused by check_rollout_engine, naming the sampler."""
    if vision and method_of(model).rewards and training.get("use_vllm"):
        if "use_vllm" not in (model.training_config or {}):
            training["use_vllm"] = False
