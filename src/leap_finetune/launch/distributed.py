"""Running the worker on several processes with Ray Train.

The driver has already validated and prepared everything in the run folder; each Ray Train worker
runs the same function a single-device run calls in-process (`recipes.<type>.train`), with the
resolved config. Ray Train sets up the process group (NCCL on GPUs, gloo on CPUs) and transformers'
Trainer (through accelerate) gives each worker its shard of every batch: each row once per epoch.
Everything about processes, scheduling and failures is Ray's; nothing here re-implements it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from leap_finetune import signals
from leap_finetune.errors import LeapError, RunFailed
from leap_finetune.launch.devices import DevicePlan, physical_ids
from leap_finetune.launch.ray_cluster import alive_nodes, check_reachable
from leap_finetune.runs.processes import NO_MULTICAST

# NVLink multicast is off on the machines we run on; a process that uses it can take a shared host's
# GPUs out of service. Every process the project starts keeps these (Ray workers included).
PASSED_ON = (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "HF_HOME",
    "HF_TOKEN",
    "TOKENIZERS_PARALLELISM",
    "LEAP_FINETUNE_SHOW_WARNINGS",
    "LEAP_FINETUNE_PROFILE",
    "WANDB_API_KEY",
    "WANDB_MODE",
    "LEAP_FINETUNE_FAULT",
)
PREEMPTION_WATCHER = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


def worker_env() -> dict[str, str]:
    env = dict(NO_MULTICAST)
    env.update({k: os.environ[k] for k in PASSED_ON if k in os.environ})
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray Train 2.60's preemption watcher is one more actor process per run (~1.2 s of a CPU to start, measured)
    # that only tells the workers a node is going away: ours stop on leap-finetune's own request, and a run never
    # restarts (max_failures 0), so it watches for nobody. A user's own setting is kept.
    env[PREEMPTION_WATCHER] = os.environ.get(PREEMPTION_WATCHER, "0")
    return env


def run_on_ray(resolved_json: dict, plan: DevicePlan, run_dir: Path) -> None:
    """Train with `plan.workers` Ray Train workers; returns when they are done, raises RunFailed when a
    worker failed (naming its rank and where its log is)."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig

    from leap_finetune.launch.worker import train_worker

    env = worker_env()
    started_here = not ray.is_initialized()
    if started_here:
        os.environ.update(NO_MULTICAST)  # the driver's own processes too
        # After a worker died, Ray Train waits this long for the survivors' process groups to shut down
        # (they cannot: their peer is gone) before it reports the failure; its 30 s only delay the error.
        os.environ.setdefault("TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S", "5")
        if plan.address:
            check_reachable(
                plan.address,
                resolved_json.get("ray", {}).get("connect_timeout_s", 30) if resolved_json.get("ray") else 30,
            )
            ray.init(
                address=plan.address,
                runtime_env={"env_vars": env},
                logging_level="ERROR",
                logging_config=ray.LoggingConfig(log_level="ERROR"),
            )
        else:
            _init_local(plan, env)
    try:
        _check_cluster(resolved_json, plan)
    except LeapError:
        if started_here:
            ray.shutdown()
        raise
    from leap_finetune.launch.worker import worker_error

    worker_error(run_dir)  # (an error file left by a run whose driver was killed before reading it)
    # ray.init replaces the SIGTERM handler; the workers do not see this process's signals: the first asks them
    # (through the run folder) to save a checkpoint and stop, a second stops them at once (ray.shutdown below).
    signals.reinstall()
    signals.enter("training", on_first=lambda signum: signals.request_stop(run_dir, signum))
    resources = (resolved_json.get("ray") or {}).get("resources_per_worker")
    trainer = _leap_trainer(cleaner=_has_dashboard())(
        train_worker,
        train_loop_config=resolved_json,
        scaling_config=ScalingConfig(num_workers=plan.workers, use_gpu=plan.use_gpu, resources_per_worker=resources),
        torch_config=TorchConfig(backend=plan.backend),
        run_config=RunConfig(
            name="ray",
            storage_path=str(run_dir),
            failure_config=FailureConfig(max_failures=0),
            worker_runtime_env={"env_vars": env},
        ),
    )
    try:
        trainer.fit()
    except ray.train.TrainingFailedError as err:
        from leap_finetune.launch.worker import worker_error

        user = worker_error(run_dir)  # a mistake of the user's that a worker found: said as such (exit 2)
        if user is not None:
            raise user from None
        raise RunFailed(_failure_message(err, run_dir)) from None
    finally:
        signals.clear_request(run_dir)
        if started_here:
            ray.shutdown()


def _check_cluster(resolved_json: dict, plan: DevicePlan) -> None:
    """The workers fit on the Ray cluster as it is now (Ray Train would wait for them without end)."""
    from leap_finetune.launch.ray_resources import check_cluster

    resources = (resolved_json.get("ray") or {}).get("resources_per_worker")
    cluster = f"the Ray cluster at {plan.address}" if plan.address else "the local Ray instance"
    check_cluster(
        resources, plan.use_gpu, plan.workers, alive_nodes(), resolved_json.get("config_path") or "config", cluster
    )


def _has_dashboard() -> bool:
    try:
        from ray._private.worker import get_dashboard_url

        return bool(get_dashboard_url())
    except Exception:  # noqa: BLE001 - Ray's private helper moved: assume the cluster has one
        return True


def _leap_trainer(cleaner: bool):
    """Ray Train's TorchTrainer, with the driver's signals left to leap-finetune (leap_finetune/signals.py: the
    first Ctrl-C or SIGTERM asks the workers to save a checkpoint and stop; Ray Train's own SIGINT handler aborts
    the run without one), and, without `cleaner`, without its PlacementGroupCleaner."""
    from ray.train.torch import TorchTrainer

    try:
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    except ImportError:  # Ray moved it: keep Ray's default callbacks
        PlacementGroupCleanerCallback = None  # noqa: N806

    class LeapTorchTrainer(TorchTrainer):
        def _register_sigint_handler(self, controller):
            signals.reinstall()

        def _create_default_callbacks(self):
            callbacks = super()._create_default_callbacks()
            if cleaner or PlacementGroupCleanerCallback is None:
                return callbacks
            # On a Ray without its dashboard (our local instance and the SLURM job's cluster) the cleaner asks
            # Ray's State API (served by the dashboard) whether the controller lives; without it each question
            # waits 10 s, and stopping the cleaner at the end of every run failed after ~12 s with a traceback
            # on the console (measured with Ray 2.60): it cannot do its work there. Ray still removes a run's
            # placement groups when the run's driver ends; a cluster with a dashboard keeps the cleaner.
            return [c for c in callbacks if not isinstance(c, PlacementGroupCleanerCallback)]

    return LeapTorchTrainer


def _init_local(plan: DevicePlan, env: dict) -> None:
    """A local Ray instance that sees exactly the plan's training GPUs (servers keep theirs)."""
    import ray

    from leap_finetune.launch.ray_reaper import reap_left_over, watch

    for line in reap_left_over():  # (an earlier instance whose driver and watcher were both killed)
        print(f"note: {line}", file=sys.stderr)
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if plan.use_gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = physical_ids(plan.training)
    try:
        # address="local": a new instance, never an unrelated cluster that happens to run on this machine
        ray.init(
            address="local",
            num_cpus=os.cpu_count(),
            num_gpus=len(plan.training) if plan.use_gpu else 0,
            include_dashboard=False,
            logging_level="ERROR",
            runtime_env={"env_vars": env},
            logging_config=ray.LoggingConfig(log_level="ERROR"),
        )
        # (its agents outlive a SIGKILLed driver: a watcher stops them - launch/ray_reaper.py)
        watch(ray._private.worker._global_node.get_session_dir_path())
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def _failure_message(err: Exception, run_dir: Path) -> str:
    """Which rank failed and how, from Ray's error (its text names `[Rank N Error Snippet]`)."""
    import re

    text = str(err)
    ranks = sorted(set(re.findall(r"Rank (\d+)", text)))
    lines = [line for line in text.splitlines() if line.strip()]
    cause = next(
        (line.strip() for line in reversed(lines) if re.match(r"\s*\w+(Error|Exception|Interrupt)\b", line)),
        lines[-1].strip() if lines else type(err).__name__,
    )
    who = f"worker rank {', '.join(ranks)}" if ranks else "a worker"
    return (
        f"{who} failed: {cause}\n  the worker logs are under Ray's session folder "
        f"(/tmp/ray/session_latest/logs/worker-*.err); the last complete checkpoint in {run_dir} is intact: "
        "resume with training_config.resume_from_checkpoint: latest"
    )
