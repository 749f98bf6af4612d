"""training_config's resume keys: `resume_from_checkpoint` (where a run continues) and `resume_allow_changes` (the
keys a resume may change; what they may be: config/resume.py; the comparison with the checkpoint's run:
launch/plan.py)."""

from __future__ import annotations

from leap_finetune.config.resume import RESUME_ALLOWABLE, RESUME_KEEPS_TRAINING
from leap_finetune.config.suggest import unknown_key_fix
from leap_finetune.errors import LeapError
from leap_finetune.validate.keys import trainer_arg_fields

# what a resume never changes, as the keys a config names them by
NEVER_CHANGED = ("dataset", "model_name", "training_type", "chat_template", "peft_config", "retrieval", "loss_on")


def check_resume(training: dict, where: str, training_type: str) -> str | None:
    """`resume_from_checkpoint` taken out of `training` (the trainer is given it by the recipe) and returned;
    `resume_allow_changes` checked in place."""
    resume = training.pop("resume_from_checkpoint", None)
    if resume is not None and not isinstance(resume, str):
        raise LeapError(
            f"training_config.resume_from_checkpoint is {resume!r}: expected latest (or true), a checkpoint-N "
            "folder, or a run folder (its newest complete checkpoint)",
            where=where,
            fix="resume_from_checkpoint: latest",
        )
    check_allow_changes(training, where, training_type)
    return resume


def check_allow_changes(training: dict, where: str, training_type: str) -> None:
    """`resume_allow_changes`: a list of training_config keys (or `rewards`), or [all]."""
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
    fixed = [v for v in value if v in NEVER_CHANGED]
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
