"""The YAML contract: one pydantic model per block, composed here into the top level (`LeapConfigModel`). The
blocks live by concern: schema_dataset.py (`dataset`, `image_processor`), schema_evals.py (`evals`, `async_eval`),
schema_cluster.py (`ray`, `slurm`), schema_grpo.py (`grpo_rollout`, `rewards`); `retrieval` is here.

`training_config` and `peft_config` are open-ended on purpose (any TRL / transformers training
argument and any peft LoRA option can be set), so they are checked against the fields of the
underlying library classes in validate/ rather than copied here (leap-finetune's own training_config keys:
config/own_keys.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from leap_finetune.config.schema_base import StrictModel
from leap_finetune.config.schema_cluster import RayConfig, SlurmConfig
from leap_finetune.config.schema_dataset import DatasetConfig, ImageProcessorConfig, dataset_shorthand
from leap_finetune.config.schema_distill import DistillConfig
from leap_finetune.config.schema_environment import EnvironmentConfig
from leap_finetune.config.schema_evals import AsyncEvalConfig, EvalsConfig
from leap_finetune.config.schema_grpo import GrpoRolloutConfig, RewardsConfig, reward_list
from leap_finetune.methods import training_types


class RetrievalPrompts(StrictModel):
    query: str | None = Field(default=None, description='Text put before every query, e.g. "query: ".')
    document: str | None = Field(
        default=None, description='Text put before every document (positive and negatives), e.g. "document: ".'
    )


class RetrievalConfig(StrictModel):
    """embedding / colbert: the loss, prompts, lengths and (for a backbone that is not yet an embedding
    model) the pooling. Built on sentence-transformers."""

    loss: Literal["mnrl", "cached_mnrl"] = Field(
        default="mnrl",
        description="`mnrl`: in-batch negatives (multiple negatives ranking; ColBERT: its "
        "contrastive MaxSim loss); `cached_mnrl`: the same with GradCache, for large batches in little memory.",
    )
    mini_batch_size: int = Field(default=32, gt=0, description="`cached_mnrl`: rows encoded at once.")
    prompts: RetrievalPrompts = Field(default_factory=RetrievalPrompts, description="Query and document prompts.")
    temperature: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="The loss's softmax temperature (the similarities are divided by it; sentence-transformers' "
        "`scale` is 1/temperature); default: the loss's own - 0.05 for embedding (cosine similarities), 1.0 for "
        "ColBERT (MaxSim sums).",
    )
    gather_across_devices: bool | None = Field(
        default=None,
        description="Several workers: every device's rows are each query's negatives (more negatives, one "
        "all-gather per step); default: on with several workers.",
    )
    query_max_length: int | None = Field(
        default=None,
        gt=0,
        description="Tokens kept of a query, prompt included "
        "(default: the model's maximum); longer queries are cut and counted.",
    )
    document_max_length: int | None = Field(
        default=None,
        gt=0,
        description="Tokens kept of a document, prompt "
        "included (default: the model's maximum); longer ones are cut and counted.",
    )
    pooling: Literal["auto", "mean", "lasttoken", "cls"] = Field(
        default="auto",
        description="embedding, for a model without a sentence-transformers config: `auto` is "
        "last-token pooling for a causal LM (LFM2), mean pooling for an encoder.",
    )


class QatConfig(StrictModel):
    """Quantization-aware training (models/qat.py): the linear layers train through the target format's rounding."""

    target: Literal["q4_0", "q8_0"] = Field(
        description="The format the model will ship in: `q4_0` or `q8_0` (llama.cpp GGUF: blocks of 32, matched "
        "value for value). Export with the same type: `export RUN --gguf q4_0`."
    )
    start_step: int = Field(
        default=0,
        ge=0,
        description="The step from which the forward pass uses the quantized weights (before it: plain training); "
        "0 = from the start",
    )


class LeapConfigModel(StrictModel):
    """The top level of a leap-finetune YAML file."""

    project_name: str = Field(
        default="leap-finetune",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Groups runs under outputs/{project_name}/.",
    )
    model_name: str = Field(
        min_length=1,
        description="A Hub id, an LFM short name (LFM2-1.2B), a local folder (a model folder; a run folder: its model/; a project folder ./outputs/PROJECT: the model/ of its newest finished run), or a built-in tiny model (tiny-lfm2, tiny-lfm2.5, tiny-lfm2.5-vl).",
    )
    training_type: str = Field(default="sft", description="One of: " + ", ".join(training_types()) + ".")
    chat_template: str | None = Field(
        default=None,
        description="`lfm2`, `lfm2.5`, `lfm2-v1`, `model` (the tokenizer's own) or a .jinja file; default: chosen from the model family.",
    )
    dataset: DatasetConfig | list[DatasetConfig] | None = Field(
        default=None,
        description="Where the training rows come from (keys below); required to train. A list of such "
        "mappings mixes several sources (each with its own keys, `weight` or `epochs`). A path alone is shorthand "
        "for `{path: ...}`.",
    )
    training_config: dict = Field(
        default_factory=dict,
        description="Any TRL / sentence-transformers training argument, plus leap-finetune's own keys: `extends`, `loss_on`, `compile_layers`, `padding_free`, `optimizer_precision`, `batch_tokens`, `gradient_communication`, `resume_allow_changes` and the vision keys (docs/config.md).",
    )
    peft_config: dict | None = Field(
        default=None, description="LoRA options (any peft LoraConfig field), plus `extends` and `use_peft`."
    )
    output_dir: str | None = Field(
        default=None, min_length=1, description="Run folder; default outputs/{project_name}/{run_name}."
    )
    evals: EvalsConfig | None = Field(
        default=None, description="Benchmarks during training and for `leap-finetune eval`."
    )
    async_eval: AsyncEvalConfig | None = Field(
        default=None,
        description="Where benchmarks run: sync (training pauses; the default), sidecar (SLURM jobs) "
        "or reserved (an evaluation server on GPUs of its own), and the failure policy (keys below).",
    )
    slurm: SlurmConfig | None = Field(
        default=None, description="`leap-finetune slurm`: the sbatch job that runs this config (keys below)."
    )
    ray: RayConfig | None = Field(
        default=None,
        description="Several devices or nodes through Ray Train (keys below); default: decided from the visible GPUs.",
    )
    grpo_rollout: GrpoRolloutConfig | None = Field(
        default=None, description="GRPO: GPUs for the rollout server, the judge and training (keys below)."
    )
    rewards: RewardsConfig | None = Field(
        default=None, description="GRPO's rewards (keys below); a list (or one name) is shorthand for `funcs`."
    )
    environment: EnvironmentConfig | None = Field(
        default=None,
        description="GRPO: tools the model calls during rollouts, run for real, their results shown to it "
        "(multi-turn episodes; keys below, docs/agents.md).",
    )
    retrieval: RetrievalConfig | None = Field(
        default=None, description="embedding / colbert: loss, prompts, lengths, pooling (keys below)."
    )
    adapter_path: str | None = Field(
        default=None,
        min_length=1,
        description="Continue training this LoRA adapter (a folder with adapter_config.json: leap-finetune's "
        "adapter/, peft's or Unsloth's save, or a LoRA run of this project): its rank, alpha and targets are its "
        "own; on the base model_name (docs/continue.md).",
    )
    teacher: str | None = Field(
        default=None,
        min_length=1,
        description="distill: the model the student learns from - a Hub id, a local folder, or a run of this "
        "project (its model/); it must share the student's tokenizer.",
    )
    distill: DistillConfig | None = Field(
        default=None, description="distill: the loss, temperature and the share of SFT's loss (keys below)."
    )
    checkpoint: str | None = Field(
        default=None,
        min_length=1,
        description="`leap-finetune eval` only: a run folder, checkpoint folder or GGUF file (`export --gguf`) to "
        "evaluate instead of model_name.",
    )
    image_processor: ImageProcessorConfig | None = Field(
        default=None,
        description="Vision-language models: how images become tokens (keys below; default: the model's own).",
    )
    gpu_memory: str | int | float | None = Field(
        default=None,
        description="The GPU memory a training process may use, to plan for a card you are not on (`24GiB`, "
        "`80GB`, `16` in GiB; 1 to 1,024 GiB; `--gpu-memory` on plan, validate and run wins); default: the free "
        "memory of the GPU a run trains on. Defaults you did not set change to fit it (docs/memory.md).",
    )
    qat: QatConfig | None = Field(
        default=None,
        description="sft, dpo, kto, grpo: quantization-aware training for the format you ship "
        "(`qat: {target: q4_0}`; docs/export.md). Full fine-tunes and LoRA (the frozen base's layers train through "
        "the rounding; the adapters are added after it); not with a 4-bit base (QLoRA).",
    )
    samples: int = Field(
        default=0,
        ge=0,
        description="Print the model's answers to this many held-out prompts before and after training.",
    )

    @field_validator(
        "dataset", mode="before", json_schema_input_type=DatasetConfig | list[DatasetConfig | str] | str | None
    )
    @classmethod
    def check_dataset(cls, value):
        """`dataset: data/train.jsonl` is shorthand for `dataset: {path: data/train.jsonl}` (in a list too)."""
        return dataset_shorthand(value)

    @field_validator("rewards", mode="before", json_schema_input_type=RewardsConfig | list[str | dict] | str | None)
    @classmethod
    def check_rewards(cls, value):
        """`rewards: [accuracy]` and `rewards: accuracy` are shorthand for `rewards: {funcs: [accuracy]}`."""
        if isinstance(value, (list, str)):
            return {"funcs": reward_list(value)}
        return value
