"""The original system's keys: job configs of Liquid4All's leap-finetune / liquid-finetune, read in our words.

Their configs name some things differently (`training_type: vlm_sft`, `training_config.loss` for retrieval,
`slurm.directives`, ...). `translate` rewrites a raw config mapping: each original key becomes ours with the same
meaning (a Change with a note naming our key, printed by `validate` and `run`), or is refused with our key and the
value to write (a Change with `refused`; `validate` and `run` stop on it). `leap-finetune migrate OLD.yaml` writes
the rewritten file with a comment per change (config/legacy_yaml.py). docs/migrating.md lists every key and its
fate; tests/config/test_legacy.py keeps the two in step.

Only keys of the original that ours does not read the same way are here: a key both systems spell and mean alike
(`model_name`, `dataset.path`, `peft_config.use_peft`, the TRL arguments ...) passes untouched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

# The original's training types that are ours under another name: the model decides vision-language or MoE
TYPES = {"vlm_sft": "sft", "vlm_dpo": "dpo", "vlm_grpo": "grpo", "moe_sft": "sft", "moe_dpo": "dpo"}
# Its retrieval losses, per training type -> ours
LOSSES = {
    "embedding": {"multiple_negatives_ranking": "mnrl", "cached_multiple_negatives_ranking": "cached_mnrl"},
    "colbert": {"contrastive": "mnrl", "cached_contrastive": "cached_mnrl"},
}
# Its QAT types that are ours (llama.cpp's block formats); the others target formats we do not export
QAT_TYPES = {"gguf_q4_0": "q4_0", "gguf_q8_0": "q8_0"}
# Its slurm.directives that are keys of ours (the rest stay #SBATCH lines: extra_sbatch)
DIRECTIVES = {"--partition": "partition", "--time": "time", "--account": "account", "--mem": "mem", "-p": "partition"}


@dataclass(frozen=True)
class Change:
    old: str  # the original's key as written: "training_config.loss", "dataset.train_path"
    new: str | None  # ours: "retrieval.loss"; None where the key goes (no effect here) or is refused
    note: str  # what it became, and why
    refused: bool = False  # not translated: the run stops, `fix` says what to write
    fix: str = ""

    def comment(self) -> str:
        """The migrated file's comment above the key (or in its header, for one removed)."""
        return f"was {self.old}: {self.note}" if self.new is not None else f"{self.old}: {self.note}"

    def said(self) -> str:
        """One line for `validate`, `run` and `migrate`."""
        if self.refused:
            return f"{self.old}: {self.note}"
        if self.new is None:
            return f"{self.old} (the original system's key) removed: {self.note}"
        return f"{self.old} (the original system's key) is {self.new} here: {self.note}"


def translate(raw: dict) -> tuple[dict, list[Change]]:
    """`raw` with every original key rewritten to ours, and what changed (in the order of the config's blocks).
    `raw` itself is not modified."""
    raw = copy.deepcopy(raw)
    changes: list[Change] = []
    for rule in RULES:
        changes += rule(raw)
    return raw, changes


def is_legacy(raw: dict) -> bool:
    """Whether anything of `raw` is the original system's."""
    return bool(translate(raw)[1])


def _move(block: dict, old: str, target: dict, new: str) -> bool:
    """block[old] -> target[new] where target has no `new` of its own (True: moved); a key renamed in its own
    block keeps its place (the migrated file reads in the old one's order)."""
    if old not in block or new in target:
        return False
    if target is block:
        items = [(new if key == old else key, value) for key, value in block.items()]
        block.clear()
        block.update(items)
    else:
        target[new] = block.pop(old)
    return True


def _top_level(raw: dict) -> list[Change]:
    changes = []
    if "job_name" in raw:
        value = raw.pop("job_name")
        if "project_name" not in raw:
            raw["project_name"] = value
            changes.append(Change("job_name", "project_name", "runs are grouped under outputs/PROJECT_NAME/"))
        else:
            changes.append(Change("job_name", None, "project_name names the run here (the original preferred it too)"))
    if "benchmarks" in raw and "evals" not in raw:
        raw["evals"] = raw.pop("benchmarks")
        changes.append(Change("benchmarks", "evals", "the benchmarks block is evals: here"))
    if "config_dir" in raw:
        raw.pop("config_dir")
        changes.append(Change("config_dir", None, "relative paths start at the config file's folder"))
    for key, fix in (
        ("modal", "run it with `leap-finetune run` on the machine, or `leap-finetune slurm` on a cluster"),
        ("kuberay", "point ray.address at the KubeRay cluster's head (ray://HOST:10001) and `leap-finetune run`"),
        ("rl_env", "write the tools under environment: (docs/agents.md)"),
        ("model_config", "set model loading options under training_config.model_init_kwargs (docs/config.md)"),
    ):
        if key in raw:
            changes.append(Change(key, None, f"'{key}:' is not read here", refused=True, fix=fix))
    return changes


def _training_type(raw: dict) -> list[Change]:
    kind = raw.get("training_type")
    if isinstance(kind, str) and kind in TYPES:
        raw["training_type"] = TYPES[kind]
        return [
            Change(
                f"training_type: {kind}",
                f"training_type: {TYPES[kind]}",
                "vision-language (LFM2-VL) and MoE (LFM2-8B-A1B) models train under the plain training types: "
                "model_name decides",
            )
        ]
    return []


def _dataset(raw: dict) -> list[Change]:
    items = raw.get("dataset")
    items = [items] if isinstance(items, dict) else items if isinstance(items, list) else []
    changes = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        name = "dataset" if isinstance(raw["dataset"], dict) else f"dataset[{index}]"
        for old, new, note in (
            ("train_path", "path", "the training rows"),
            ("train_split", "split", "the Hub split the training rows are read from"),
            ("train_subset", "subset", "the Hub configuration (subset)"),
            ("cache_dataset", "cache", "prepared rows are cached by content (docs/data.md)"),
        ):
            if _move(item, old, item, new):
                changes.append(Change(f"{name}.{old}", f"{name}.{new}", note))
        if isinstance(item.get("type"), str) and item["type"] in TYPES:
            old_type = item["type"]
            item["type"] = TYPES[old_type]
            changes.append(Change(f"{name}.type: {old_type}", f"{name}.type: {item['type']}", "as training_type"))
        if "hf_streaming_batch_size" in item:
            item.pop("hf_streaming_batch_size")
            changes.append(
                Change(f"{name}.hf_streaming_batch_size", None, "Hub datasets are read whole through their cache")
            )
        for old in ("val_split", "val_subset"):
            if old in item:
                changes.append(
                    Change(
                        f"{name}.{old}",
                        None,
                        "the evaluation rows come from val_path (read with split and subset) or test_size",
                        refused=True,
                        fix=f"save that split as a file and set {name}.val_path to it, or use {name}.test_size",
                    )
                )
    return changes


# the original's retrieval prompts when a config left them out (its RetrievalPrompts defaults)
ORIGINAL_PROMPTS = {"query": "query: ", "positive": "document: ", "negative": "document: "}
# its profiles that are ours under another name
PROFILES = {"DEFAULT_VLM_GRPO": "DEFAULT_GRPO", "DEFAULT_VLM_DPO": "DEFAULT_DPO", "DEFAULT_MOE_SFT": "DEFAULT_SFT",
            "DEFAULT_MOE_DPO": "DEFAULT_DPO"}  # fmt: skip
RETRIEVAL_KEYS = ("loss", "prompts", "temperature", "mini_batch_size", "gather_across_devices")


def _retrieval(raw: dict) -> list[Change]:
    """embedding / colbert: the loss settings the original kept in training_config live in retrieval: here."""
    training = raw.get("training_config")
    kind = raw.get("training_type")
    if not isinstance(kind, str) or kind not in LOSSES or not isinstance(training, dict):
        return []
    retrieval = raw.setdefault("retrieval", {}) if isinstance(raw.get("retrieval", {}), dict) else None
    if retrieval is None:
        return []
    changes = []
    if isinstance(training.get("loss"), str) and training["loss"] in LOSSES[kind] and "loss" not in retrieval:
        old = training.pop("loss")
        retrieval["loss"] = LOSSES[kind][old]
        changes.append(Change(f"training_config.loss: {old}", f"retrieval.loss: {retrieval['loss']}", "the same loss"))
    prompts = training.get("prompts")
    if isinstance(prompts, dict) and set(prompts) <= {"query", "positive", "negative"}:
        prompts = {**ORIGINAL_PROMPTS, **prompts}  # (the original's defaults for the ones not given)
        documents = {str(prompts[k]) for k in ("positive", "negative")}
        if len(documents) > 1:
            changes.append(
                Change(
                    "training_config.prompts",
                    None,
                    "positive and negative documents get one prompt here (retrieval.prompts.document)",
                    refused=True,
                    fix=f"write retrieval.prompts: {{query: {prompts.get('query')!r}, document: "
                    f"{prompts.get('positive')!r}}}",
                )
            )
        else:
            training.pop("prompts")
            retrieval["prompts"] = {"query": prompts["query"], "document": prompts["positive"]}
            changes.append(Change("training_config.prompts", "retrieval.prompts", "query and document prompts"))
    for key in ("temperature", "mini_batch_size", "gather_across_devices"):
        if _move(training, key, retrieval, key):
            changes.append(Change(f"training_config.{key}", f"retrieval.{key}", "the same setting of the loss"))
    if not retrieval:
        raw.pop("retrieval")
    return changes


def _training_config(raw: dict) -> list[Change]:
    training = raw.get("training_config")
    if not isinstance(training, dict):
        return []
    changes = []
    if "base" in training and "extends" not in training:
        training["extends"] = training.pop("base")
        changes.append(Change("training_config.base", "training_config.extends", "the profile your keys override"))
    profile = training.get("extends")
    if isinstance(profile, str) and profile in PROFILES:
        training["extends"] = PROFILES[profile]
        changes.append(
            Change(
                f"training_config.extends: {profile}",
                f"training_config.extends: {PROFILES[profile]}",
                "the model decides vision or MoE; the training type's profile",
            )  # fmt: skip
        )
    for old, new, note in (
        ("adapter_path", "adapter_path", "the LoRA adapter training continues from (docs/continue.md)"),
        ("chat_template_path", "chat_template", "a .jinja file (or lfm2, lfm2.5, model)"),
    ):
        if _move(training, old, raw, new):
            changes.append(Change(f"training_config.{old}", new, note))
    if "output_dir" in training:  # (the original's was a parent of the runs; ours names one run's folder)
        training.pop("output_dir")
        changes.append(
            Change(
                "training_config.output_dir",
                None,
                "runs go to outputs/PROJECT/RUN here (the original's was a folder of runs); output_dir: at the top "
                "level names one run's folder",
            )
        )
    if isinstance(training.get("freeze_vision_encoder"), bool) and "train_vision_encoder" not in training:
        frozen = training.pop("freeze_vision_encoder")
        training["train_vision_encoder"] = not frozen
        changes.append(
            Change(
                "training_config.freeze_vision_encoder",
                "training_config.train_vision_encoder",
                "the opposite switch (freeze: true = train: false)",
            )
        )
    changes += _lr_multipliers(training)
    image_keys = [k for k in ("max_image_tokens", "min_image_tokens", "do_image_splitting") if k in training]
    processor = raw.setdefault("image_processor", {}) if image_keys else None
    for key in image_keys:
        if isinstance(processor, dict) and _move(training, key, processor, key):
            changes.append(Change(f"training_config.{key}", f"image_processor.{key}", "how images become tokens"))
    changes += _qat(raw, training)
    return changes


def _lr_multipliers(training: dict) -> list[Change]:
    """Its per-component learning rates: the vision tower's is ours; the others must stay 1 (the base rate)."""
    multipliers = training.get("lr_multipliers")
    if not isinstance(multipliers, dict):
        return []
    vision = {k: v for k, v in multipliers.items() if "vision_tower" in str(k)}
    others = {k: v for k, v in multipliers.items() if k not in vision and v != 1 and v != 1.0}
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in multipliers.values())
    if others or not numbers or len(set(vision.values())) > 1:
        return [
            Change(
                "training_config.lr_multipliers",
                None,
                f"only the vision encoder's learning rate has a multiplier here; {others or vision} cannot be said",
                refused=True,
                fix="write training_config.vision_encoder_lr_multiplier: N and remove lr_multipliers",
            )
        ]
    training.pop("lr_multipliers")
    if vision:
        training.setdefault("vision_encoder_lr_multiplier", next(iter(vision.values())))
    return [
        Change(
            "training_config.lr_multipliers",
            "training_config.vision_encoder_lr_multiplier",
            "the vision encoder's learning rate as a multiple of learning_rate (projector and language model: 1)",
        )
    ]


def _qat(raw: dict, training: dict) -> list[Change]:
    qat = training.get("qat")
    if not isinstance(qat, dict) or "qat" in raw:
        return []
    kind = qat.get("type")
    if not isinstance(kind, str) or kind not in QAT_TYPES:
        return [
            Change(
                f"training_config.qat.type: {kind}",
                None,
                "quantization-aware training here targets llama.cpp's q4_0 and q8_0 (GGUF) only",
                refused=True,
                fix="write qat: {target: q4_0} (or q8_0) at the top level, or remove training_config.qat",
            )
        ]
    training.pop("qat")
    raw["qat"] = {"target": QAT_TYPES[kind]}
    said = f"qat: {{target: {QAT_TYPES[kind]}}} (export with --gguf {QAT_TYPES[kind]})"
    changes = [Change(f"training_config.qat.type: {kind}", said, "the same rounding, value for value")]
    if qat.get("quantize_reference") is False:
        changes.append(
            Change(
                "training_config.qat.quantize_reference: false",
                None,
                "DPO's reference model here is never quantized (it scores through the base weights)",
            )
        )
    for key in ("target", "parameter_precision"):
        if qat.get(key) not in (None, "auto"):
            changes.append(Change(f"training_config.qat.{key}", None, "for the vLLM formats only"))
    return changes


def _evals(raw: dict) -> list[Change]:
    evals = raw.get("evals")
    if not isinstance(evals, dict) or "best_checkpoint_metrics" not in evals:
        return []
    metrics = evals["best_checkpoint_metrics"]
    metrics = metrics if isinstance(metrics, dict) else {}
    names = [b.get("name") for b in evals.get("benchmarks") or [] if isinstance(b, dict)]
    keys = [_benchmark_metric(str(k), names) for k in metrics]
    if len(metrics) == 1 and keys[0] is not None:
        training = raw.setdefault("training_config", {})
        if isinstance(training, dict) and "metric_for_best_model" not in training:
            evals.pop("best_checkpoint_metrics")
            training["metric_for_best_model"] = keys[0]
            return [
                Change(
                    "evals.best_checkpoint_metrics",
                    "training_config.metric_for_best_model",
                    f"the best checkpoint is the one with the highest {keys[0]} (docs/migrating.md)",
                )
            ]
    return [
        Change(
            "evals.best_checkpoint_metrics",
            None,
            "the best checkpoint is chosen by one benchmark's score here, not a weighted sum of several",
            refused=True,
            fix="write training_config.metric_for_best_model: benchmark/NAME (one of: "
            + ", ".join(f"benchmark/{n}" for n in names)
            + ")",
        )
    ]


def _benchmark_metric(key: str, names: list) -> str | None:
    """A benchmark the original's metric key names (`gsm8k`, `benchmark/gsm8k`, `gsm8k/score`) as ours."""
    bare = key.removeprefix("eval_").removeprefix("benchmark/").removeprefix("benchmarks/")
    name = bare.split("/")[0]
    return f"benchmark/{name}" if name in names else None


def _slurm(raw: dict) -> list[Change]:
    slurm = raw.get("slurm")
    if not isinstance(slurm, dict):
        return []
    changes = []
    per_task, tasks = _count(slurm.pop("gpus_per_task", None)), _count(slurm.pop("ntasks_per_node", None))
    if per_task is not None and "gpus_per_node" not in slurm:
        slurm["gpus_per_node"] = per_task * (tasks or 1)
        changes.append(
            Change("slurm.gpus_per_task", "slurm.gpus_per_node", "one task per node here runs Ray over its GPUs")
        )
    elif per_task is not None:
        changes.append(Change("slurm.gpus_per_task", None, "slurm.gpus_per_node, given too, says the GPUs"))
    if tasks is not None:
        changes.append(Change("slurm.ntasks_per_node", None, "one task per node runs Ray there"))
    per_gpu = _count(slurm.pop("cpus_per_gpu", None))
    if per_gpu is not None and "cpus_per_task" not in slurm:
        gpus = _count(slurm.get("gpus_per_node")) or 1
        slurm["cpus_per_task"] = per_gpu * gpus
        changes.append(Change("slurm.cpus_per_gpu", "slurm.cpus_per_task", "the node's CPUs for its one task"))
    elif per_gpu is not None:
        changes.append(Change("slurm.cpus_per_gpu", None, "slurm.cpus_per_task, given too, says the CPUs"))
    if _move(slurm, "setup_commands", slurm, "setup"):
        changes.append(Change("slurm.setup_commands", "slurm.setup", "shell lines run first"))
    directives = slurm.pop("directives", None)
    if directives is not None and not isinstance(directives, list):
        slurm["directives"] = directives  # (kept: our validator names the key)
    if isinstance(directives, list):
        extra = list(slurm.get("extra_sbatch") or [])
        for line in directives:
            flag, _, value = str(line).partition("=")
            if flag in DIRECTIVES and value and DIRECTIVES[flag] not in slurm:
                slurm[DIRECTIVES[flag]] = value
            else:
                extra.append(str(line))
        if extra:
            slurm["extra_sbatch"] = extra
        changes.append(
            Change("slurm.directives", "slurm.partition/time/account/mem, extra_sbatch", "the same #SBATCH lines")
        )
    for key in ("output", "error"):
        if key in slurm:
            slurm.pop(key)
            changes.append(
                Change(f"slurm.{key}", None, "the job's log goes where `leap-finetune slurm` says (the run's logs)")
            )
    return changes


def _count(value) -> int | None:
    """A count the original read as a number (its YAML may quote it); anything else: None (our validator says)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _rewards(raw: dict) -> list[Change]:
    rewards = raw.get("rewards")
    if isinstance(rewards, dict) and "recipe" in rewards:
        return [
            Change(
                "rewards.recipe",
                None,
                "rewards here are functions (a name of ours or FILE.py::FUNCTION), not a recipe class",
                refused=True,
                fix="write rewards: [accuracy] (a grounding recipe's: [iou, box_format]) or rewards: {funcs: "
                "[rewards.py::my_reward]} (docs/grpo.md)",
            )
        ]
    return []


RULES = (_top_level, _training_type, _dataset, _retrieval, _training_config, _evals, _slurm, _rewards)


def read_original_keys(raw: dict, where: str) -> tuple[dict, list[str]]:
    """`validate` and `run`: the config in our keys and a note per original key read; a key that cannot be read
    the same way stops here (an error with our key and the value to write)."""
    from leap_finetune.errors import LeapError

    raw, changes = translate(raw)
    refused = [c for c in changes if c.refused]
    if refused:
        first = refused[0]
        more = f" [and {len(refused) - 1} more of the original system's keys]" if len(refused) > 1 else ""
        raise LeapError(
            f"{first.old} is the original system's key: {first.note}{more}",
            where=f"{where}: {first.old.split(':')[0]}",
            fix=first.fix + " (`leap-finetune migrate CONFIG` rewrites the other original keys; docs/migrating.md)",
        )
    notes = [c.said() for c in changes]
    if notes:
        notes.append(
            f"{len(changes)} key(s) of the original system read as ours; `leap-finetune migrate CONFIG` rewrites the "
            "file in our keys (docs/migrating.md)"
        )
    return raw, notes
