"""The device plan: which GPU does what, decided by the driver from counts before Ray or any worker
starts.

Devices are counted over what the driver sees (`CUDA_VISIBLE_DEVICES` respected) or what `plan --gpus
N` says, and handed out in a fixed order: [server][judge][eval][teacher][training]. Servers are GRPO's vLLM
rollout server (`grpo_rollout.server_gpus`) and its judge (`judge_gpus`); eval is the reserved
evaluation server (`async_eval.vllm_gpus` with `mode: reserved`); teacher is distillation's teacher server
(`distill.teacher_gpus`); training gets the rest (`grpo_rollout.training_gpus` may say how many).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from leap_finetune.errors import LeapError


@dataclass
class DevicePlan:
    nodes: int
    gpus_per_node: int  # visible to the driver (0: CPU only)
    server: list[int] = field(default_factory=list)  # device indices as the driver sees them (first node)
    judge: list[int] = field(default_factory=list)
    eval: list[int] = field(default_factory=list)
    teacher: list[int] = field(default_factory=list)
    training: list[int] = field(default_factory=list)  # per node
    workers: int = 1  # training processes in all
    address: str | None = None  # an existing Ray cluster

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def in_process(self) -> bool:
        """One training process on this machine: no Ray, no start-up cost (the run as before)."""
        return self.workers == 1 and self.nodes == 1 and self.address is None

    @property
    def own_process(self) -> bool:
        """One training process that must not see every GPU of the machine (servers hold some): it runs
        as a child process that sees only its GPU (launch/single.py)."""
        return self.in_process and self.use_gpu and len(self.training) < self.gpus_per_node

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpu else "gloo"

    def to_json(self) -> dict:
        return {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "workers": self.workers,
            "in_process": self.in_process,
            "own_process": self.own_process,
            "backend": self.backend,
            "address": self.address,
            "devices": {
                "server": self.server,
                "judge": self.judge,
                "eval": self.eval,
                "teacher": self.teacher,
                "training": self.training,
            },
        }


def physical_ids(indices: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for plan indices (as the driver sees them) in a child process: mapped through
    the driver's own CUDA_VISIBLE_DEVICES when it has one."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [i.strip() for i in visible.split(",")] if visible else None
    return ",".join(ids[i] if ids and i < len(ids) else str(i) for i in indices)


def visible_gpus() -> int:
    """The GPUs this process sees (CUDA_VISIBLE_DEVICES applied). Without an NVIDIA driver here, 0 without importing
    torch (~1 s of validate and plan on a laptop). With one, counted from `nvidia-smi -L` as CUDA would count them:
    importing torch to ask it took seconds of every `validate` on the GPU machine (bench/startup.py); torch is asked
    only where nvidia-smi cannot say (not installed, failing, or MIG instances, which CUDA enumerates its own way)."""
    import glob
    import os
    import shutil

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return 0
    if shutil.which("nvidia-smi") is None and not glob.glob("/dev/nvidia[0-9]*"):
        return 0
    listed = _nvidia_smi_gpus()
    counted = count_visible(listed, visible) if listed is not None else None
    if counted is not None:
        return counted
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable CUDA: a CPU machine
        return 0


def _nvidia_smi_gpus() -> list[str] | None:
    """The UUIDs of the GPUs `nvidia-smi -L` lists, in its order; None where it cannot say."""
    import shutil
    import subprocess

    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.splitlines()
    if out.returncode != 0 or any(line.strip().startswith("MIG") for line in lines):
        return None
    gpus = [line.split("UUID:")[-1].strip(" )") for line in lines if line.startswith("GPU ")]
    return gpus


def count_visible(gpus: list[str], visible: str | None) -> int | None:
    """How many of `gpus` (UUIDs, in index order) CUDA enumerates under CUDA_VISIBLE_DEVICES `visible`, parsed as
    torch parses it (torch.cuda._parse_visible_devices): UUID prefixes if the first entry starts with GPU-, else
    leading digits of each entry (`1gpu2` is 1); the list ends at the first entry that names nothing (or a GPU
    beyond the machine's), and a repeated one makes it empty. None for MIG UUIDs (CUDA's own enumeration)."""
    if visible is None:
        return len(gpus)
    if visible.startswith("MIG-"):
        return None
    chosen: list[int] = []
    for entry in visible.split(","):
        if visible.startswith("GPU-"):
            matches = [i for i, uuid in enumerate(gpus) if entry.startswith("GPU-") and uuid.startswith(entry)]
            index = matches[0] if len(matches) == 1 else -1  # (an ambiguous prefix names nothing)
        else:
            digits = entry.strip()
            digits = digits[: len(digits) - len(digits.lstrip("+0123456789"))] if digits else ""
            index = int(digits) if digits.lstrip("+").isdigit() else -1
        if index in chosen:
            return 0
        if not 0 <= index < len(gpus):
            break
        chosen.append(index)
    return len(chosen)


def plan_devices(
    *,
    gpus: int,
    nodes: int = 1,
    server: int = 0,
    judge: int = 0,
    eval_gpus: int = 0,
    teacher: int = 0,
    training: int | None = None,
    num_workers: int | None = None,
    address: str | None = None,
    fsdp: bool = False,
    where: str = "config",
) -> DevicePlan:
    """Counts in, device indices out; an impossible plan is an error with the numbers."""
    reserved = server + judge + eval_gpus + teacher
    if reserved and nodes > 1:
        raise LeapError(
            f"the plan reserves {reserved} GPU(s) of a node for servers (server {server}, judge {judge}, eval "
            f"{eval_gpus}, teacher {teacher}), but the run spans {nodes} nodes: local servers are single-node only",
            where=where,
            fix="use colocate mode (vLLM inside each training worker), external server URLs "
            "(vllm_server_base_url, a judge URL, distill.teacher_base_url), or async_eval mode: sidecar",
        )
    plan = DevicePlan(nodes=nodes, gpus_per_node=gpus, address=address)
    if gpus == 0:
        if reserved:
            keys = ", ".join(
                k
                for k, n in (
                    ("grpo_rollout.server_gpus", server),
                    ("grpo_rollout.judge_gpus", judge),
                    ("async_eval.vllm_gpus", eval_gpus),
                    ("distill.teacher_gpus", teacher),
                )
                if n
            )
            raise LeapError(
                f"the plan reserves {reserved} GPU(s) for servers ({keys}), but no GPU is visible",
                where=where,
                fix="run on a GPU machine, or plan for one: leap-finetune plan CONFIG --gpus N"
                + (", or set async_eval.vllm_gpus: 0 (a CPU evaluator)" if eval_gpus else ""),
            )
        plan.workers = (num_workers or 1) if nodes == 1 else (num_workers or nodes)
        _check_fsdp(fsdp, plan.workers, where)
        if fsdp:
            # accelerate applies FSDP on GPU workers only: on CPU workers the key would be ignored silently.
            raise LeapError(
                "training_config.fsdp shards the model over GPU workers, but no GPU is visible (on CPU "
                "workers accelerate would ignore it and train with DDP)",
                where=where,
                fix="run on GPUs (plan one with: leap-finetune plan CONFIG --gpus N), or remove fsdp",
            )
        return plan
    available = gpus - reserved
    wanted = training if training is not None else available
    if wanted < 1 or wanted > available:
        raise _too_few_gpus(gpus, nodes, {"server": server, "judge": judge, "eval": eval_gpus, "teacher": teacher},
                            training, where)  # fmt: skip
    index = 0
    order = (("server", server), ("judge", judge), ("eval", eval_gpus), ("teacher", teacher), ("training", wanted))
    for name, count in order:
        setattr(plan, name, list(range(index, index + count)))
        index += count
    total = wanted * nodes
    if num_workers is not None and num_workers > total:
        raise LeapError(
            f"ray.num_workers is {num_workers}, but the plan has {total} training GPU(s)"
            + (f" ({wanted} on each of {nodes} nodes)" if nodes > 1 else ""),
            where=where,
            fix=f"set ray.num_workers to {total} or fewer (one worker per GPU), or leave it out",
        )
    plan.workers = num_workers or total
    if num_workers is not None and nodes == 1:
        plan.training = plan.training[:num_workers]
    _check_fsdp(fsdp, plan.workers, where)
    return plan


# Each kind of server's GPUs: its key, what it is, and how to run it without GPUs of this node
RESERVED = (
    (
        "server",
        "grpo_rollout.server_gpus",
        "the rollout server",
        (
            "grpo_rollout.server_gpus: 0 with training_config.vllm_mode: colocate (vLLM inside the training workers) or "
            "training_config.vllm_server_base_url (a server you run)"
        ),
    ),
    (
        "judge",
        "grpo_rollout.judge_gpus",
        "the judge",
        "grpo_rollout.judge_gpus: 0 (the judge then runs on CPU; or give rewards.judge.base_url, a judge you run)",
    ),
    (
        "eval",
        "async_eval.vllm_gpus",
        "the evaluation server",
        "async_eval.vllm_gpus: 0 (a CPU evaluator) or async_eval.mode: sidecar",
    ),
    (
        "teacher",
        "distill.teacher_gpus",
        "the teacher server",
        "distill.teacher_gpus: 0 (the teacher beside the student) or distill.teacher_base_url (a server you run)",
    ),
)


def _too_few_gpus(gpus: int, nodes: int, counts: dict[str, int], training: int | None, where: str) -> LeapError:
    """What each part of the plan takes, by its key, against what is visible; and what to change."""
    reserved = sum(counts.values())
    parts = [f"{counts[name]} for {what} ({key})" for name, key, what, _ in RESERVED if counts[name]]
    parts.append(
        f"{training} for training (grpo_rollout.training_gpus)" if training is not None else "at least 1 for training"
    )
    needed = reserved + (training if training is not None else 1)
    visible = f"{gpus} {'is' if gpus == 1 else 'are'} visible" + (" per node" if nodes > 1 else "")
    fixes = []
    if training is not None and gpus - reserved >= 1:
        fixes.append(f"set grpo_rollout.training_gpus to {gpus - reserved} or fewer (or leave it out: the rest)")
    fixes.append(
        f"run where {needed} GPUs are visible (CUDA_VISIBLE_DEVICES decides; plan for them with "
        f"leap-finetune plan CONFIG --gpus {needed})"
    )
    fixes += [f"take {what} off this node's GPUs: {instead}" for name, _, what, instead in RESERVED if counts[name]]
    return LeapError(
        f"the plan needs {needed} GPU(s)"
        + (" per node" if nodes > 1 else "")
        + ": "
        + ", ".join(parts)
        + f"; {visible}",
        where=where,
        fix="; or ".join(fixes),
    )


def device_plan(resolved, *, gpus: int | None = None, nodes: int | None = None) -> DevicePlan:
    """The plan for a resolved config: over the GPUs this driver sees (or `gpus`), one node (or
    `nodes`), or the shape of the Ray cluster at ray.address / RAY_ADDRESS (asked, bounded in time)."""
    from leap_finetune.launch.ray_cluster import cluster_nodes, cluster_shape, ray_address

    ray = resolved.ray
    address = ray_address(resolved)
    where = resolved.config_path or "config"
    this_machine, cluster = gpus is None, None
    if address and gpus is None and nodes is None:
        cluster = cluster_nodes(address, ray.connect_timeout_s if ray else 30)
        nodes, gpus = cluster_shape(cluster)
    rollout = getattr(resolved, "grpo_rollout", None)
    servers = {}
    if rollout is not None:
        servers = {"server": rollout.server_gpus, "judge": rollout.judge_gpus, "training": rollout.training_gpus}
    async_eval = getattr(resolved, "async_eval", None)
    if async_eval is not None and async_eval.mode == "reserved":
        servers["eval_gpus"] = async_eval.vllm_gpus
    if getattr(resolved, "distill", None):
        servers["teacher"] = resolved.distill.get("teacher_gpus", 0)
    plan = plan_devices(
        gpus=visible_gpus() if gpus is None else gpus,
        nodes=nodes or 1,
        num_workers=ray.num_workers if ray else None,
        address=address,
        fsdp=bool(resolved.training.get("fsdp")),
        where=where,
        **servers,
    )
    if not plan.in_process:
        _check_resources(ray.resources_per_worker if ray else None, plan, cluster, this_machine, where)
        from leap_finetune.config.rules import best_benchmark

        if best_benchmark(resolved.training) and plan.workers > 1:  # (validate says it for ray.num_workers)
            raise LeapError(
                f"metric_for_best_model is a benchmark's score, and the plan has {plan.workers} training workers: "
                "the benchmarks run on rank 0 only, and the best checkpoint must be chosen on every rank alike",
                where=where,
                fix="train on one GPU (ray: {num_workers: 1}) for the best checkpoint by a benchmark, or use "
                "metric_for_best_model: eval_loss",
            )
    judge = getattr(resolved, "rewards", None) and resolved.rewards.judge
    local_servers = plan.server or plan.judge or plan.teacher or (judge is not None and judge.base_url is None)
    if local_servers and address:
        raise LeapError(
            f"the run trains on the Ray cluster at {address}, and the plan has local servers (rollout "
            "server, judge or teacher) on the driver's machine: the cluster's workers may share their GPUs or not "
            "reach them",
            where=where,
            fix="give the servers' URLs (training_config.vllm_server_base_url, rewards.judge.base_url, "
            "distill.teacher_base_url), "
            "or use vllm_mode: colocate, or run on one machine without ray.address",
        )
    if judge is not None and judge.base_url is None and plan.nodes > 1:
        raise LeapError(
            f"rewards.judge has no base_url, so the driver would run the judge on this node, but the run "
            f"spans {plan.nodes} nodes: local servers are single-node only",
            where=where,
            fix="run the judge yourself (e.g. vllm serve MODEL on one node) and give its URL as rewards.judge.base_url",
        )
    if not plan.in_process:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise LeapError(
                f"the plan has {plan.workers} training workers, which run through Ray Train, and Ray is not installed",
                where=where,
                fix="pip install 'leap-finetune[distributed]' (or set ray.num_workers: 1 for one process)",
            )
    return plan


def _check_resources(
    resources: dict | None, plan: DevicePlan, cluster: list[dict] | None, this_machine: bool, where: str
) -> None:
    """The workers fit on the cluster (asked) or on the local Ray instance the run starts (its CPUs where this is
    the machine, its GPUs), before Ray or any worker starts."""
    from leap_finetune.launch.ray_resources import check_cluster, check_for_plan, check_own_ray

    check_for_plan(resources, plan.use_gpu, where)
    if cluster is not None:
        check_cluster(resources, plan.use_gpu, plan.workers, cluster, where, f"the Ray cluster at {plan.address}")
    elif plan.address is None and plan.nodes == 1:
        import os

        node = {"GPU": float(len(plan.training))} if plan.use_gpu else {}
        if this_machine:
            node["CPU"] = float(os.cpu_count() or 1)
        check_own_ray(resources, plan.use_gpu, plan.workers, 1, node, where, "a local Ray instance on this machine")


def _check_fsdp(fsdp: bool, workers: int, where: str) -> None:
    if fsdp and workers < 2:
        raise LeapError(
            "training_config.fsdp shards the model over several workers, but the plan has 1",
            where=where,
            fix="run with several GPUs (or ray.num_workers >= 2), or remove fsdp (on one GPU: LoRA, or "
            "model_init_kwargs: {dtype: bfloat16})",
        )
