"""The cluster blocks: `ray:` (several devices or nodes through Ray Train) and `slurm:` (the sbatch job of
`leap-finetune slurm`)."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from leap_finetune.config.schema_base import StrictModel


class RayConfig(StrictModel):
    """Training on several devices with Ray Train: one worker process per training GPU (or `num_workers`
    CPU workers), data-parallel (DDP; FSDP with `training_config.fsdp`)."""

    address: str | None = Field(
        default=None,
        min_length=1,
        description="An existing Ray cluster (`host:port`, or `auto`) for multi-node runs; default: the RAY_ADDRESS "
        "environment variable, else a local Ray instance when more than one worker is planned.",
    )
    num_workers: int | None = Field(
        default=None,
        gt=0,
        description="Training processes. Default: one per training GPU of the plan (all visible GPUs not reserved "
        "for servers); without GPUs, 1 (in-process). N CPU workers (gloo) run the distributed path on a laptop.",
    )
    resources_per_worker: dict[str, float] | None = Field(
        default=None,
        description="Ray resources per worker, e.g. {CPU: 8, GPU: 1} (default: 1 GPU on GPUs, 1 CPU "
        "otherwise): CPU, GPU, memory (bytes) or a custom resource of the cluster, finite amounts >= 0; the workers "
        "must fit on the cluster, checked before any starts.",
    )
    connect_timeout_s: float = Field(default=30, gt=0, description="How long to wait for `address` to answer.")


class SlurmConfig(StrictModel):
    """`leap-finetune slurm`: an sbatch script that brings up a Ray cluster over the allocation and runs the
    job on it. `--nodes` / `--gpus-per-node` on the command line override `nodes` / `gpus_per_node`."""

    partition: str | None = Field(default=None, min_length=1, description="#SBATCH --partition.")
    account: str | None = Field(default=None, min_length=1, description="#SBATCH --account.")
    time: str = Field(default="04:00:00", min_length=1, description="#SBATCH --time: the job's wall-clock limit.")
    nodes: int = Field(default=1, gt=0, description="#SBATCH --nodes.")
    gpus_per_node: int = Field(default=0, ge=0, description="#SBATCH --gpus-per-node (0: a CPU job).")
    cpus_per_task: int | None = Field(
        default=None,
        gt=0,
        description="#SBATCH --cpus-per-task (one task per node runs Ray there); default: the partition's default.",
    )
    mem: str | None = Field(default=None, min_length=1, description="#SBATCH --mem, e.g. 200G.")
    job_name: str | None = Field(default=None, min_length=1, description="#SBATCH --job-name; default: project_name.")
    extra_sbatch: list[str] = Field(
        default_factory=list,
        description='More #SBATCH options, e.g. ["--qos=high"], '
        "one line each, as sbatch reads them (a value with spaces or `#` in double quotes: "
        '--comment="run #2"); the values of --mem-per-cpu, --mem-per-gpu, --gres, --cpus-per-task, --ntasks and '
        "--gpus* are checked in SLURM's formats, as slurm.time and slurm.mem are (also where sbatch is not "
        "installed); an option the script writes from a slurm: key (--nodes, --time, --job-name, --output, and "
        "--partition, --account, --mem, --cpus-per-task, --gpus-per-node where that key is set) is refused.",
    )
    setup: list[str] = Field(
        default_factory=list,
        description='Shell lines run first on the head node, e.g. ["module load cuda", "source ~/venv/bin/activate"].',
    )
    ray_start_timeout_s: int = Field(default=600, gt=0, description="How long to wait for every node's GPUs to join.")
    stop_before_time_limit_s: int = Field(
        default=300,
        ge=0,
        le=65535,
        description="#SBATCH --signal=B:TERM@N: this many seconds "
        "before the time limit the run is asked to save a checkpoint and stop (SLURM "
        "sends it up to 60 s early); 0: no warning, the limit's own SIGTERM leaves "
        "the cluster's KillWait to save one.",
    )

    @model_validator(mode="after")
    def _stop_within_the_limit(self) -> SlurmConfig:
        limit = slurm_seconds(self.time)
        if limit is not None and self.stop_before_time_limit_s and self.stop_before_time_limit_s >= limit:
            raise ValueError(
                f"stop_before_time_limit_s ({self.stop_before_time_limit_s} s) is not shorter than the "
                f"job's time limit ({self.time} = {limit} s): the run would be asked to stop as it "
                "starts; give fewer seconds (or 0) or a longer time"
            )
        return self


def slurm_seconds(value: str) -> int | None:
    """A SLURM time limit in seconds (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS); None when it is not one."""
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value.strip())
    if not match:
        return None
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # HH:MM:SS
        return a * 3600 + b * 60 + c
    return a * 60 + (b or 0)  # MM[:SS]
