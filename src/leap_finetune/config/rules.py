"""Rules across `training_config` keys that transformers or TRL only enforce once training starts
(after the model loaded and the run folder exists). Each `check_<thing>` raises one precise error.

`check_trainer_parts` goes further and builds what the Trainer would build from the arguments - the
optimizer class and the learning-rate scheduler (on a one-parameter stand-in model) - so a missing
optimizer package or bad scheduler kwargs fail at `validate` too.
"""

from __future__ import annotations

import os

from leap_finetune.errors import LeapError
from leap_finetune.methods import METHODS, method_of

# embedding / colbert: besides each method's eval_metrics (methods/), the recipe's retrieval evaluator logs
# retrieval_<score>_<metric>@k (score: cosine for embedding, maxsim for colbert) and benchmark_<name>_<score>_...
# (what sentence-transformers' retrieval evaluator logs for the recipe's settings, read from real runs)
RETRIEVAL_METRIC = r"(accuracy@1|accuracy@10|precision@1|precision@10|recall@1|recall@10|ndcg@10|mrr@10|map@10)"


def retrieval_score(training_type: str) -> str:
    return "maxsim" if method_of(training_type).multi_vector else "cosine"


def check_training_rules(
    training_type: str, training: dict, where: str, *, rewards: tuple[str, ...] = (), benchmarks: tuple[str, ...] = ()
) -> None:
    """`rewards`: GRPO's reward names (rewards/<name>/mean); `benchmarks`: the names of evals.benchmarks."""
    check_multi_process(training, where)
    check_hub_push(training, where)
    check_packing_length(training, where)
    check_best_model_metric(training_type, training, where, rewards=rewards, benchmarks=benchmarks)
    check_sampling(training_type, training, where)


def check_multi_process(training: dict, where: str) -> None:
    """Sharding is FSDP's (through transformers); DeepSpeed is not wired in. FSDP's need for several
    workers is checked with the device plan (launch/devices.py)."""
    if training.get("deepspeed"):
        raise LeapError(
            "training_config.deepspeed is not supported by leap-finetune",
            where=where,
            fix="for a model that does not fit one GPU use training_config.fsdp (FSDP2 through "
            "transformers) over several GPUs, or LoRA",
        )


def check_sampling(training_type: str, training: dict, where: str) -> None:
    """The length-aware samplers read each row's `input_ids`; preference rows hold prompt/chosen/rejected ids.
    KTO's KL estimate pairs each row with its neighbours in a fixed order (TRL refuses any other order once the
    model has loaded; a batch of one is refused by the loader)."""
    strategy = training.get("train_sampling_strategy")
    loss_type = training.get("loss_type", "kto")
    kl = (
        method_of(training_type).kl_pairs and loss_type != "apo_zero_unpaired"
    )  # (TRL: every loss type but this has a KL)
    if not method_of(training_type).length_samplers and strategy in ("batch_rebalance", "group_by_length"):
        able = " and ".join(name for name, m in METHODS.items() if m.length_samplers)
        raise LeapError(
            f"training_config.train_sampling_strategy: {strategy} works for {able} only (it balances rows "
            f"by their length), not for {training_type}",
            where=where,
            fix="remove train_sampling_strategy, or set it to " + ("sequential" if kl else "random or sequential"),
        )
    if kl:
        if strategy not in (None, "sequential"):
            raise LeapError(
                f"training_config.train_sampling_strategy: {strategy} breaks KTO's KL estimate (loss_type "
                f"{loss_type}): each row's KL completion is paired with its neighbours in a fixed order",
                where=where,
                fix="remove train_sampling_strategy (KTO's default is sequential), or use loss_type: apo_zero_unpaired",
            )


def check_hub_push(training: dict, where: str) -> None:
    if training.get("push_to_hub") and os.environ.get("HF_HUB_OFFLINE") == "1":
        raise LeapError(
            "training_config.push_to_hub is true, but the Hugging Face Hub is off (HF_HUB_OFFLINE=1)",
            where=where,
            fix="unset HF_HUB_OFFLINE where the Hub is reachable, or set push_to_hub: false",
        )


def check_packing_length(training: dict, where: str) -> None:
    if training.get("packing") and training.get("max_length") is None:
        raise LeapError(
            "training_config.packing packs rows into sequences of max_length tokens, but max_length is null",
            where=where,
            fix="set max_length (e.g. 2048), or packing: false",
        )


def best_benchmark(training: dict) -> str | None:
    """The benchmark whose score metric_for_best_model names (`benchmark/NAME`, `benchmark/NAME/score`), if any."""
    import re

    found = re.fullmatch(r"(?:eval_)?benchmark/([^/]+)(?:/score)?", str(training.get("metric_for_best_model") or ""))
    return found.group(1) if found else None


def benchmark_every(evals, training: dict) -> int:
    """Every how many steps the benchmarks run during training: evals.eval_steps, else training's eval_steps."""
    return evals.eval_steps or training.get("eval_steps") or 500


def check_best_model_metric(
    training_type: str, training: dict, where: str, *, rewards: tuple[str, ...] = (), benchmarks: tuple[str, ...] = ()
) -> None:
    import re

    name = training.get("metric_for_best_model")
    if name is None:
        return
    bare = name.removeprefix("eval_")
    known = method_of(training_type).eval_metrics
    if bare in known or (best_benchmark(training) in benchmarks and not method_of(training_type).retrieval):
        return
    if method_of(training_type).rewards:
        found = re.fullmatch(r"rewards/(.+)/(mean|std)", bare)
        if found and found.group(1) in rewards:
            return
        named = ", ".join(f"eval_rewards/{reward}/mean" for reward in rewards)
        fix = (
            "use one of: "
            + ", ".join(f"eval_{m}" for m in known[:3])
            + (f", {named}" if named else "")
            + ", or another of "
            + ", ".join(f"eval_{m}" for m in known[3:])
        )
    elif method_of(training_type).retrieval:
        score = retrieval_score(training_type)
        if re.fullmatch(rf"retrieval_{score}_{RETRIEVAL_METRIC}", bare):
            return
        found = re.fullmatch(rf"benchmark_(.+)_{score}_{RETRIEVAL_METRIC}", bare)
        if found and found.group(1) in benchmarks:
            return
        fix = (
            f"use eval_retrieval_{score}_ndcg@10 (the held-out split's retrieval; also accuracy, precision, recall "
            f"@1/@10, mrr@10, map@10), "
            + "".join(f"eval_benchmark_{b}_{score}_ndcg@10, " for b in benchmarks)
            + "or eval_loss"
        )
    else:
        fix = "use one of: " + ", ".join(f"eval_{m}" for m in known)
    if benchmarks and not method_of(training_type).retrieval:
        fix += " - or a benchmark's score: " + ", ".join(f"benchmark/{b}" for b in benchmarks)
    raise LeapError(
        f"training_config.metric_for_best_model is '{name}', which {training_type} evaluation does not log",
        where=where,
        fix=fix,
    )


# training_config keys that choose the optimizer; without any of them the trainer's default AdamW is used
OPTIMIZER_KEYS = ("optim", "optim_args", "optim_target_modules")


def check_trainer_parts(args, where: str, training: dict | None = None) -> None:
    """The optimizer class and the scheduler the Trainer would make from `args` (a TRL config). `training`: the
    run's training_config; when no key of it chooses the optimizer, the trainer's default AdamW is not asked for
    (its class always exists, and asking imports transformers' Trainer: seconds of `validate`)."""
    import torch
    from transformers.optimization import get_scheduler

    if training is None or any(key in training for key in OPTIMIZER_KEYS):
        from transformers import Trainer

        try:
            Trainer.get_optimizer_cls_and_kwargs(args)
        except (ImportError, ValueError, TypeError) as err:
            raise LeapError(
                f"training_config.optim '{getattr(args.optim, 'value', args.optim)}': {str(err).splitlines()[0]}",
                where=where,
                fix="install what it names, or use optim: adamw_torch (the default)",
            ) from None
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=args.learning_rate)
    kwargs = args.lr_scheduler_kwargs
    if kwargs is not None and not isinstance(kwargs, dict):
        raise LeapError(
            f"training_config.lr_scheduler_kwargs is {kwargs!r}: expected a mapping",
            where=where,
            fix="e.g. lr_scheduler_kwargs: {min_lr_rate: 0.1}",
        )
    try:
        get_scheduler(
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=1,
            num_training_steps=10,
            scheduler_specific_kwargs=kwargs or {},
        )
    except (ValueError, TypeError) as err:
        raise LeapError(
            f"training_config.lr_scheduler_type '{getattr(args.lr_scheduler_type, 'value', args.lr_scheduler_type)}' "
            f"with lr_scheduler_kwargs {kwargs or {}}: {str(err).splitlines()[0]}",
            where=where,
            fix="set the scheduler's arguments in lr_scheduler_kwargs (see transformers' get_scheduler)",
        ) from None


ROUTER_COEF_MAX = 1.0


def check_router_coefs(training: dict, where: str) -> None:
    """router_aux_loss_coef / router_z_loss_coef (models/moe_router.py): a number from 0 to 1 (YAML 1.1 reads `1e-3`
    as text: taken as the number it spells)."""
    for key in ("router_aux_loss_coef", "router_z_loss_coef"):
        value = training.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            raise LeapError(
                f"training_config.{key} is {value!r}: expected a number >= 0",
                where=where,
                fix=f"set {key} to a small weight such as 0.001, or 0 to turn the loss off",
            )
        if value > ROUTER_COEF_MAX:  # (published MoE recipes use 0.001-0.02: above 1 the router loss is the loss)
            usual = "Mixtral's 0.02, Switch's 0.01" if key == "router_aux_loss_coef" else "ST-MoE's"
            raise LeapError(
                f"training_config.{key} is {value!r}: expected at most {ROUTER_COEF_MAX:g} - a weight this large "
                "outweighs the language loss, and the run would train the routers instead of the answers",
                where=where,
                fix=f"set {key} to a small weight such as 0.001 ({usual}), or 0 to turn it off",
            )
        training[key] = float(value)


def check_batch_tokens(user: dict, training: dict, where: str) -> None:
    """`batch_tokens` (data/token_batches.py): a whole number that holds the longest row, instead of a number of
    rows per micro-batch and of the samplers that choose rows by count. `user`: the keys the config set itself (the
    profile's per_device_train_batch_size is not the user's)."""
    if "batch_tokens" not in user:
        return
    from leap_finetune.config.numbers import shown

    value = user["batch_tokens"]
    longest = training.get("max_length")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        least = f"max_length ({longest})" if isinstance(longest, int) and longest >= 1 else "1"
        raise LeapError(
            f"training_config.batch_tokens is {shown(value)}: expected a whole number of tokens >= {least}",
            where=where,
            fix="give the tokens per micro-batch and device as a whole number, e.g. batch_tokens: "
            f"{max(16384, 4 * longest) if isinstance(longest, int) and longest >= 1 else 16384}",
        )
    for key, why in (
        ("per_device_train_batch_size", "the rows of a micro-batch are as many as fit in batch_tokens"),
        ("train_sampling_strategy", "batch_tokens chooses the rows of each micro-batch by their lengths"),
    ):
        if key in user:
            raise LeapError(
                f"training_config sets both batch_tokens and {key}: {why}",
                where=where,
                fix=f"remove {key}, or remove batch_tokens",
            )
    if training.get("packing"):
        raise LeapError(
            "training_config sets both batch_tokens and packing: packing makes rows of max_length tokens, counted "
            "by per_device_train_batch_size",
            where=where,
            fix="remove packing (batch_tokens with padding-free batches - the GPU default - fills micro-batches "
            "without merging rows), or remove batch_tokens",
        )
    if longest is not None and value < longest:
        raise LeapError(
            f"training_config.batch_tokens is {value}, less than max_length {longest}: a row of max_length tokens "
            "would not fit a micro-batch",
            where=where,
            fix=f"use batch_tokens >= {longest} (a few times max_length fills the GPU), or lower max_length",
        )
