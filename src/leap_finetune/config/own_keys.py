"""leap-finetune's own training_config keys, declared once: the type of each, its choices and what it means.

Every other training_config key is an argument of the training type's trainer config (TRL's or
sentence-transformers'), checked against that class itself (validate/training.py). These are not: leap-finetune
reads them from the resolved config's `training` (the speed plan, the optimizer, the sampler, the DDP hook, the
vision parts, the resume) and the trainer never sees them (`trainer_arguments`). Which training types take which
key: `EVERY_TYPE` below, each type's `Method.own_keys` (methods/), and `VISION_KEYS` for the types that read
images. `validate` takes their types and choices from here; docs/config.md its table of them (validate/reference.py).
"""

from __future__ import annotations

import types
from typing import Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field

from leap_finetune.config import communication, profiles
from leap_finetune.config import precision as precisions
from leap_finetune.errors import LeapError
from leap_finetune.methods import VISION_KEYS, Method

# the keys of every training type (the rest: Method.own_keys, and VISION_KEYS for a type with a vision profile)
EVERY_TYPE = ("extends", "resume_from_checkpoint", "resume_allow_changes", communication.KEY)


def _values(text: str) -> dict:
    """The values column of docs/config.md for a key whose type alone does not say them (a choice or a switch
    does)."""
    return {"values": text}


class OwnTrainingKeys(BaseModel):
    """leap-finetune's training_config keys, in the order docs/config.md lists them. Unset is each key's default
    (said in its description): the model is the declaration, never filled in."""

    model_config = ConfigDict(extra="forbid")

    extends: Literal[tuple(profiles.TRAINING_PROFILES)] | None = Field(
        default=None, description="the profile your keys override"
    )
    loss_on: Literal["assistant", "all", "final_assistant"] | None = Field(
        default=None,
        description="sft only: which tokens carry the loss: every assistant turn's content and its `<\\|im_end\\|>` "
        "(default), every token, or only the last assistant turn (DPO and KTO train on the completions)",
    )
    loss_on_thinking: bool | None = Field(
        default=None,
        description="sft, distill: whether an assistant turn's reasoning (`thinking` / `reasoning_content`, or a "
        "`<think>...</think>` block in its content, as the chat template renders it) carries loss; default true. "
        "false trains the answer after it only (docs/sft.md)",
    )
    reference_adapter: bool | None = Field(
        default=None,
        description="dpo, kto, grpo with `adapter_path`: the reference model is the base plus that adapter (true, "
        "default: the step starts from the adapter's own answers; a frozen copy of the adapter, not of the base) "
        "or the bare base (false: the adapter switched off)",
    )
    resume_from_checkpoint: str | None = Field(
        default=None,
        description="continue a run: `latest` is the newest intact checkpoint (every file as it was written) of the "
        "newest run of this project",
        json_schema_extra=_values("`latest` or a `checkpoint-N` folder"),
    )
    resume_allow_changes: list[str] | None = Field(
        default=None,
        description="a resume refuses a config that changes how the run trains (learning rate, scheduler, optimizer "
        "settings, loss settings, rewards); keys listed here apply from the resumed step on (the new learning-rate "
        "schedule from its first step) and are recorded in `resume_changes.json` and the model card. The data, the "
        "model's shape, `seed` and `optim` can never change",
        json_schema_extra=_values("a list of keys, or `[all]`"),
    )
    compile_layers: bool | None = Field(
        default=None,
        description="sft, dpo, kto, embedding, colbert: torch.compile each decoder layer (the LM head and loss stay "
        "eager; DPO's and KTO's reference model too; an encoder's LFM2 backbone); default: on for LFM2 on a CUDA GPU, "
        "off elsewhere",
    )
    padding_free: bool | None = Field(
        default=None,
        description="kto, embedding, colbert (sft and dpo: TRL's key of the same name, the same meaning): each padded "
        "batch runs through the LFM2 model as one flat row without padding (models/flat_rows.py; the same losses as "
        "padded batches); default: on for LFM2 on a CUDA GPU, off elsewhere",
    )
    optimizer_precision: Literal[tuple(precisions.PRECISIONS)] | None = Field(
        default=None,
        description="sft, dpo, kto: `fp32` (default) float32 master weights and AdamW states; `bf16_kahan` bf16 "
        "weights and states with torch-optimi's Kahan-summation AdamW (25% less peak memory on LFM2-1.2B, the same "
        "loss curve, not faster; opt-in, see docs/speed.md)",
    )
    precision: Literal[tuple(precisions.MATMUL_PRECISIONS)] | None = Field(
        default=None,
        description="sft, distill: the precision of the decoder's linear-layer matmuls. `bf16` (default): bf16 "
        "autocast; `fp8`: torchao's float8 training (rowwise scales) - inputs and weights cast to FP8 for each "
        "matmul, the weights, gradients and optimizer as before. Needs a GPU with FP8 matmuls (compute capability "
        "8.9+: H100, H200, L4, RTX 4090) and torchao; opt-in, see docs/speed.md",
    )
    gradient_communication: Literal[tuple(communication.VALUES)] | None = Field(
        default=None,
        description="every training type, several workers (DDP): the precision of the gradients' all-reduce between "
        "workers. `fp32` (default) is exact; `bf16` registers torch's `bf16_compress_hook` (half the bytes between "
        "GPUs; each gradient rounded to bf16 once per step, the float32 weights and optimizer unchanged). Nothing "
        "with one process or with weights already in bf16 (their gradients are bf16); refused with `fsdp`. `plan` "
        "says which all-reduce runs; the run report and model card what DDP reported. Opt-in, see docs/speed.md",
    )
    batch_tokens: int | None = Field(
        default=None,
        description="sft: micro-batches cut by tokens instead of rows: each holds as many rows as fit in this many "
        "tokens per device (padding-free batches count real tokens, padded ones rows x the longest); replaces "
        "`per_device_train_batch_size` (validate refuses both, and with `packing` or `train_sampling_strategy`). A "
        "step stays `gradient_accumulation_steps` micro-batches per worker, the loss the mean over its tokens, every "
        "row once per epoch; the rows are grouped once and visited in a new order each epoch. Opt-in, see "
        "docs/speed.md",
        json_schema_extra=_values("a whole number >= `max_length`"),
    )
    router_aux_loss_coef: float | None = Field(
        default=None,
        description="sft, dpo, kto, grpo of a mixture-of-experts model (LFM2-MoE): the weight of the routers' "
        "load-balancing loss, added to every training step's loss (models/moe_router.py); default: the model's own "
        "`router_aux_loss_coef` where its config has one, else 0.001 (LFM2-MoE balances with an expert bias and has "
        "none); `0` turns it off. A note on any other model (it has no routers)",
        json_schema_extra=_values("a number from 0 to 1"),
    )
    router_z_loss_coef: float | None = Field(
        default=None,
        description="the same models: the weight of the routers' z-loss (the squared log-sum-exp of the router "
        "logits, which keeps them small); default 0 (off); 0.001 is ST-MoE's",
        json_schema_extra=_values("a number from 0 to 1"),
    )
    train_vision_encoder: bool | None = Field(
        default=None,
        description="sft and dpo of a vision-language model (LFM2-VL): train the vision encoder (SigLIP2); default: "
        "true for a full fine-tune, false with LoRA (true with LoRA: trained in full and saved with the adapter)",
    )
    train_projector: bool | None = Field(
        default=None,
        description="the same for the projector between the vision encoder and the language model",
    )
    train_language_model: bool | None = Field(
        default=None, description="the language model (with LoRA: its adapters); default: true"
    )
    vision_encoder_lr_multiplier: float | None = Field(
        default=None,
        description="the vision encoder's learning rate as a multiple of `learning_rate`; default 0.1",
        json_schema_extra=_values("a number > 0"),
    )


KEYS = OwnTrainingKeys.model_fields


def keys_of(method: Method) -> tuple[str, ...]:
    """The own keys a training type takes."""
    return EVERY_TYPE + method.own_keys + (VISION_KEYS if method.images else ())


def _kinds(key: str) -> tuple:
    """The key's type without its `None` (unset): (bool,), (str,), the Literal, ..."""
    annotation = KEYS[key].annotation
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def choices(key: str) -> tuple[str, ...]:
    """The values a choice key takes, in the order the docs and the errors list them; () for other keys."""
    return tuple(value for kind in _kinds(key) if get_origin(kind) is Literal for value in get_args(kind))


def is_switch(key: str) -> bool:
    return _kinds(key) == (bool,)


def values_text(key: str) -> str:
    """What the key takes, in the docs' words: its choices, `true`, `false`, or the words it is declared with."""
    if is_switch(key):
        return "`true`, `false`"
    if choices(key):
        return ", ".join(f"`{value}`" for value in choices(key))
    return KEYS[key].json_schema_extra["values"]


def check_switch(key: str, value, where: str) -> None:
    """A true/false key given anything else (YAML's `yes` is a string here, `1` a number)."""
    if is_switch(key) and not isinstance(value, bool):
        raise LeapError(f"training_config.{key} is {value!r}", where=where, fix="use true or false")


def trainer_arguments(training: dict, method: Method) -> dict:
    """The resolved training_config without what leap-finetune applies itself: every own key of the type (read
    from `training` by the recipes and the driver) and model_init_kwargs (leap-finetune's own loader applies them;
    TRL would ignore them). The keys are dropped here only: the recipes build their arguments on this."""
    taken = set(keys_of(method)) | {"model_init_kwargs"}
    return {key: value for key, value in training.items() if key not in taken}
