"""Distillation's teacher server (`distill.teacher_gpus`), decided by the driver from the plan: the teacher served on
the plan's teacher GPUs - `vllm serve` where vLLM is installed, otherwise leap-finetune's own server
(evaluation/serve.py, which answers the same /v1/completions `prompt_logprobs` request) - started before any
training process, as GRPO's judge is (launch/rl_servers.py). The training workers read the teacher's top-k
log-probs from it (recipes/distill_server.py), as from a `distill.teacher_base_url` the user runs.

Why a server rather than the teacher in the training process on another GPU: a training process that sees two
GPUs is run by the HF Trainer as DataParallel over both, and a server serves every training worker of a DDP run.
"""

from __future__ import annotations

import importlib.util
import sys

from leap_finetune.launch.devices import DevicePlan, physical_ids
from leap_finetune.runs.processes import NO_MULTICAST, ServerSpec


def teacher_engine(devices: DevicePlan) -> str:
    """`vllm` where vLLM is installed, else leap-finetune's own server."""
    return "vllm" if devices.teacher and importlib.util.find_spec("vllm") is not None else "leap-finetune"


def teacher_servers(resolved, devices: DevicePlan) -> list[ServerSpec]:
    distill = getattr(resolved, "distill", None)
    if not distill or not devices.teacher:
        return []
    port, model = distill.get("teacher_port", 8300), distill["teacher_id"]
    if teacher_engine(devices) == "vllm":
        command = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, "--host", "127.0.0.1"]
        command += ["--port", str(port), "--tensor-parallel-size", str(len(devices.teacher)), "--dtype", "bfloat16"]
        # (vLLM refuses more prompt log-probs per position than --max-logprobs, 20 by default)
        command += ["--max-logprobs", str(max(20, distill["teacher_top_k"]))]
        # (prefix caching off: with it, vLLM's prompt_logprobs of a cached prefix depend on the order of requests -
        # vllm-project/vllm#42019 - and distillation's documents share their chat template's prefix)
        command += ["--no-enable-prefix-caching"]
    else:
        # (leap-finetune's own server runs on the first of the teacher's GPUs: one model, no tensor parallelism)
        command = [sys.executable, "-m", "leap_finetune.evaluation.serve", model, "--port", str(port)]
    return [
        ServerSpec(
            name="teacher server",
            port=port,
            command=command,
            env={"CUDA_VISIBLE_DEVICES": physical_ids(devices.teacher), **NO_MULTICAST},
            start_timeout_s=600,  # (vLLM's start: loading, compiling, its CUDA graphs)
        )
    ]


def teacher_url(resolved, devices: DevicePlan) -> str | None:
    """The server the training workers read the teacher from: the user's, or the one the driver starts (same node)."""
    distill = getattr(resolved, "distill", None)
    if not distill:
        return None
    if distill.get("teacher_base_url"):
        return distill["teacher_base_url"]
    return f"http://127.0.0.1:{distill.get('teacher_port', 8300)}/v1" if devices.teacher else None
