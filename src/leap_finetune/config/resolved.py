"""The resolved config: everything the driver decided, in one serialisable object.

A worker (in-process today; Ray or torchrun later) receives exactly this, as JSON, and only trains.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from leap_finetune.config.schema import RetrievalConfig
from leap_finetune.config.schema_cluster import RayConfig, SlurmConfig
from leap_finetune.config.schema_dataset import DatasetConfig, ImageProcessorConfig
from leap_finetune.config.schema_evals import AsyncEvalConfig, EvalsConfig
from leap_finetune.config.schema_grpo import GrpoRolloutConfig, RewardsConfig


class ResolvedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config_path: str | None
    overrides: list[str] = []  # the command line's --set KEY=VALUE, in order
    project_name: str
    training_type: str
    model_name: str  # as the user wrote it
    model_id: str  # what is loaded: a Hub id, a local folder, or a built-in tiny model name
    model_family: str  # "lfm2", "lfm2.5" or "other"
    chat_template: str  # a built-in template name, "model", or an absolute .jinja path
    loss_on: str  # "assistant", "all" or "final_assistant"
    dataset: DatasetConfig | list[DatasetConfig] | None  # local paths made absolute; None for evaluation-only configs
    training: dict  # TRL / transformers training arguments (profile merged with the user's keys)
    user_training_keys: list[str] = []  # the training_config keys the config (or --set) set: never changed for it
    config_notes: list[str] = []  # settings that would do nothing in this run (validate/no_effect.py), said at start
    gpu_memory: int | None = None  # bytes: the GPU memory budget to plan for (gpu_memory:, --gpu-memory)
    predicted_gpu_memory: float | None = None  # bytes: a training process's predicted peak (memory/budget.fit_run)
    fitted_training: dict = {}  # training_config keys the memory fit changed, with their values (a resume keeps them)
    peft: dict | None  # LoRA options, None for a full fine-tune
    output_dir: str | None  # the user's output_dir, absolute
    resume_from_checkpoint: str | None  # "latest", a path, or None
    samples: int = 0
    qat: dict | None = None  # quantization-aware training: {target, start_step} (models/qat.py)
    evals: EvalsConfig | None = None  # benchmark paths made absolute
    checkpoint: str | None = None  # leap-finetune eval: a run or checkpoint folder
    config_dir: str | None = None  # relative paths (and the default outputs/ folder) start here
    ray: RayConfig | None = None  # the user's ray: block (the device plan is decided by the driver)
    slurm: SlurmConfig | None = None  # the user's slurm: block (for `leap-finetune slurm`)
    grpo_rollout: GrpoRolloutConfig | None = None  # grpo: GPU counts for servers (set for every grpo config)
    rewards: RewardsConfig | None = None  # grpo: checked reward specs (custom paths absolute)
    environment: dict | None = None  # grpo: the tools' source, their definitions and limits (validate/environment.py)
    retrieval: RetrievalConfig | None = None  # embedding / colbert (set for every such config)
    adapter_path: str | None = None  # a LoRA adapter the run continues (validate/adapter.py)
    distill: dict | None = None  # distill: the teacher (its name and model id) and the loss (validate/distill.py)
    async_eval: AsyncEvalConfig | None = None  # where benchmarks run, and the failure policy
    vision: bool = False  # a vision-language model trained on rows that may carry images (sft, dpo)
    image_processor: ImageProcessorConfig | None = None  # vision: the user's image settings (None: the model's)
    # Decided by the driver's plan (None until then):
    run_dir: str | None = None
    run_name: str | None = None
    resume_checkpoint_path: str | None = None  # the checkpoint folder "latest" (or a path) resolved to
    workers: int = 1  # training processes of the device plan (launch/devices.py)
    judge_url: str | None = None  # grpo: the local judge server the driver started
    eval_devices: str | None = None  # async_eval reserved: CUDA_VISIBLE_DEVICES of the evaluation server
    resume_changes: dict = {}  # "training_config.KEY" -> [before, now]: what this resume applies from its step on
    run_token: str | None = None  # the driver's lock on the run folder (launch/run_lock.py): workers watch it

    def to_json_dict(self) -> dict:
        return self.model_dump(mode="json")
