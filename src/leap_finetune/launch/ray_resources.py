"""Can the Ray cluster hold the plan's workers? Checked before any worker starts.

Ray Train asks Ray for `workers` bundles of `resources_per_worker` and, when the cluster cannot give them, waits
for them without end (measured with Ray 2.60: a custom resource no node has, or more CPUs than a node holds) or fails
with a traceback (every amount 0, GPU on CPU workers). Here the same bundle is worked out (ScalingConfig's rule) and
laid against what is known before any worker starts: a Ray that leap-finetune starts itself (the driver's local
instance at validate and plan, a SLURM job's cluster at `leap-finetune slurm`: counts of CPUs and GPUs, no custom
resources), the nodes of the cluster the config names (validate, plan, run), and the Ray the run is on (run).
"""

from __future__ import annotations

import math

from leap_finetune.errors import LeapError

KEY = "ray.resources_per_worker"
# What a Ray that leap-finetune starts has: the driver's local instance (launch/distributed.py: ray.init with
# num_cpus and num_gpus) and a SLURM job's cluster (launch/slurm.py: ray start with --num-cpus and --num-gpus)
OWN_RESOURCES = ("CPU", "GPU", "memory")


def worker_bundle(resources: dict | None, use_gpu: bool) -> dict[str, float]:
    """What Ray Train reserves for one worker: the resources given, without those at 0, and 1 GPU on GPU workers
    unless GPU is given; by default 1 GPU on GPUs, 1 CPU otherwise (ray.train.ScalingConfig)."""
    if resources is None:
        return {"GPU": 1.0} if use_gpu else {"CPU": 1.0}
    bundle = {name: float(amount) for name, amount in resources.items() if amount != 0}
    if use_gpu:
        bundle.setdefault("GPU", 1.0)
    return bundle


def check_for_plan(resources: dict | None, use_gpu: bool, where: str) -> None:
    """What Ray Train refuses whatever the cluster: a GPU amount that does not match the plan's workers, or a
    worker that reserves nothing."""
    gpu = (resources or {}).get("GPU")
    if gpu and not use_gpu:
        raise LeapError(
            f"{KEY}.GPU is {gpu:g}, and the plan has CPU workers (no GPU is visible)",
            where=where,
            fix="remove GPU (CPU workers reserve CPU: N), or run where GPUs are visible",
        )
    if use_gpu and gpu is not None and (gpu == 0 or not float(gpu).is_integer()):
        raise LeapError(
            f"{KEY}.GPU is {gpu:g}: each data-parallel worker trains on a GPU of its own (NCCL refuses "
            "two workers on one GPU)",
            where=where,
            fix="give GPU: 1 (or a whole number), or leave it out",
        )
    if not worker_bundle(resources, use_gpu):
        raise LeapError(
            f"{KEY} reserves nothing for a worker (every amount is 0), which Ray Train refuses",
            where=where,
            fix="give each worker at least CPU: 1 (or leave the key out)",
        )


def check_own_ray(
    resources: dict | None,
    use_gpu: bool,
    workers: int,
    nodes: int,
    node: dict[str, float],
    where: str,
    ray_instance: str,
) -> None:
    """Workers against a Ray that leap-finetune starts itself (no Ray to ask yet): `nodes` nodes, each with `node`
    (its CPUs and GPUs where known) and no custom resources, since it is started with counts only."""
    bundle = worker_bundle(resources, use_gpu)
    custom = [
        name for name in bundle if name not in OWN_RESOURCES and not name.startswith(("node:", "accelerator_type:"))
    ]
    if custom:
        raise LeapError(
            f"{KEY} asks for {', '.join(custom)}, and the run would start {ray_instance}, with CPU, GPU "
            "and memory only",
            where=where,
            fix=f"run on a Ray cluster whose nodes have it (ray.address: head:6379; ray start ... "
            f"--resources='{{\"{custom[0]}\": N}}'), or remove it",
        )
    known = {name: amount for name, amount in bundle.items() if name in node}
    fits = workers_on(node, known) * nodes if known else workers  # (memory: checked against Ray's own count at run)
    if fits < workers:
        raise LeapError(
            f"{_workers(workers, bundle, resources)} do not fit in {ray_instance} ({shown(node)}"
            + (f" on each of {nodes} nodes" if nodes > 1 else "")
            + f"): {fits} would, and Ray would wait for the others without end",
            where=where,
            fix=_fewer(bundle, fits),
        )


def check_cluster(
    resources: dict | None, use_gpu: bool, workers: int, nodes: list[dict], where: str, cluster: str
) -> None:
    """`workers` bundles on the cluster's live nodes (each worker on one node), or an error that says what is
    missing, what the cluster has and what to change."""
    bundle = worker_bundle(resources, use_gpu)
    fits = sum(workers_on(node, bundle) for node in nodes)
    if fits >= workers:
        return
    totals: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.items():
            totals[name] = totals.get(name, 0.0) + amount
    has = shown({k: v for k, v in totals.items() if not k.startswith("node:")})
    missing = [name for name in bundle if not totals.get(name)]
    if missing:
        raise LeapError(
            f"{KEY} asks for {', '.join(missing)}, which no node of {cluster} has (it has {has})",
            where=where,
            fix=f"start the cluster's nodes with it (ray start ... --resources="
            f"'{{\"{missing[0]}\": N}}'), or remove it from {KEY}",
        )
    largest = max(nodes, key=lambda node: workers_on(node, bundle), default={})
    raise LeapError(
        f"{_workers(workers, bundle, resources)} do not fit on {cluster} ({has}"
        + (f"; {len(nodes)} nodes, each worker on one" if len(nodes) > 1 else "")
        + f"): {fits} would"
        + (f" (a node holds at most {workers_on(largest, bundle)})" if len(nodes) > 1 else "")
        + ", and Ray would wait for the others without end",
        where=where,
        fix=_fewer(bundle, fits),
    )


def workers_on(node: dict, bundle: dict[str, float]) -> int:
    """How many bundles one node holds (Ray counts amounts to 1/10000)."""
    counts = [math.floor(node.get(name, 0.0) / amount + 1e-6) for name, amount in bundle.items() if amount > 0]
    return min(counts) if counts else 0


def _workers(workers: int, bundle: dict, resources: dict | None) -> str:
    return (
        f"the plan's {workers} workers, each reserving {shown(bundle)} ("
        + (f"{KEY}" if resources else f"Ray Train's default; {KEY} sets it")
        + "),"
    )


def _fewer(bundle: dict, fits: int) -> str:
    return (
        f"lower the amounts in {KEY} ({shown(bundle)} now)"
        + (f", or set ray.num_workers: {fits}" if fits else "")
        + ", or run where there is more"
    )


def shown(resources: dict) -> str:
    """`CPU 2, memory 15.4 GiB` (Ray counts memory in bytes)."""

    def amount(name: str, value: float) -> str:
        if "memory" in name:
            return f"{value / 2**30:.1f} GiB"
        return f"{value:g}"

    return ", ".join(f"{name} {amount(name, value)}" for name, value in sorted(resources.items())) or "nothing"
