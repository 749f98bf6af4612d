"""GRPO's local servers, decided by the driver from the plan: the rollout server (`trl vllm-serve`) on the
plan's server GPUs and the judge on its judge GPUs - `vllm serve` where vLLM is installed, otherwise
transformers' own OpenAI-compatible server (`transformers serve`), which also runs a judge on CPU
(`judge_gpus: 0`, for tiny judges and tests).

`plan` shows these specs; `run` starts them (runs/processes.py) before Ray or any training process.
"""

from __future__ import annotations

import importlib.util
import sys

from leap_finetune.launch.devices import DevicePlan, physical_ids

# Every process the project starts keeps NVLink multicast off (ENVIRONMENT.md: NCCL NVLS hangs there).
from leap_finetune.runs.processes import NO_MULTICAST, ServerSpec

# Each server runs as a module of the driver's own Python: the same environment (and versions) as the run,
# whether or not its console script is on PATH.
TRL_CLI = ["-m", "trl.cli.main"]
TRANSFORMERS_CLI = ["-m", "transformers.cli.transformers"]
VLLM_CLI = ["-m", "vllm.entrypoints.cli.main"]


def local_judge(resolved) -> bool:
    rewards = getattr(resolved, "rewards", None)
    return rewards is not None and rewards.judge is not None and rewards.judge.base_url is None


def judge_engine(devices: DevicePlan) -> str:
    """`vllm` on GPUs where vLLM is installed, else `transformers` (GPU or CPU)."""
    return "vllm" if devices.judge and importlib.util.find_spec("vllm") is not None else "transformers"


def judge_url(resolved) -> str | None:
    """The URL training workers send judge requests to when the driver runs the judge (same node)."""
    if not local_judge(resolved):
        return None
    return f"http://127.0.0.1:{resolved.grpo_rollout.judge_port}/v1"


def local_servers(resolved, devices: DevicePlan) -> list[ServerSpec]:
    rollout = getattr(resolved, "grpo_rollout", None)
    if rollout is None:
        return []
    t = resolved.training
    vllm_args = ["--dtype", rollout.dtype, "--gpu-memory-utilization", str(rollout.gpu_memory_utilization)]
    if rollout.max_model_len:
        vllm_args += ["--max-model-len", str(rollout.max_model_len)]
    specs = []
    if devices.server:
        specs.append(
            ServerSpec(
                name="rollout server",
                port=int(t.get("vllm_server_port", 8000)),
                command=[
                    sys.executable,
                    *TRL_CLI,
                    "vllm-serve",
                    "--model",
                    resolved.model_id,
                    "--host",
                    "0.0.0.0",
                    "--port",
                    str(t.get("vllm_server_port", 8000)),
                    "--tensor-parallel-size",
                    str(rollout.tensor_parallel_size),
                    *vllm_args,
                ],
                env={"CUDA_VISIBLE_DEVICES": physical_ids(devices.server), **NO_MULTICAST},
                start_timeout_s=rollout.server_start_timeout_s,
            )
        )
    if local_judge(resolved):
        judge = resolved.rewards.judge
        port = rollout.judge_port
        if judge_engine(devices) == "vllm":
            # the judge's own GPUs make its tensor parallelism (tensor_parallel_size is the rollout server's)
            command = [
                sys.executable,
                *VLLM_CLI,
                "serve",
                judge.model,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--tensor-parallel-size",
                str(len(devices.judge)),
                *vllm_args,
            ]
        else:
            # transformers serve, the model preloaded (its continuous batching has no cache for LFM2's
            # convolution layers, so it is not asked for).
            command = [
                sys.executable,
                *TRANSFORMERS_CLI,
                "serve",
                judge.model,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--device",
                "auto" if devices.judge else "cpu",
            ]
            if devices.judge:
                command += ["--dtype", rollout.dtype]
        env = (
            {"CUDA_VISIBLE_DEVICES": physical_ids(devices.judge), **NO_MULTICAST}
            if devices.judge
            else {"CUDA_VISIBLE_DEVICES": ""}
        )
        specs.append(
            ServerSpec(
                name="judge server", port=port, command=command, env=env, start_timeout_s=rollout.server_start_timeout_s
            )
        )
    return specs
