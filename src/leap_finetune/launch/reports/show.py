"""`leap-finetune plan`: what a run would do on which device, without starting anything.

The plan is the driver's own (launch/devices.py): the same function decides the devices of a real run,
so what `plan` prints is what `run` does. `--gpus` / `--nodes` plan for a machine you are not on.
"""

from __future__ import annotations

from leap_finetune.config.communication import ONE_PROCESS, planned_all_reduce
from leap_finetune.launch.devices import DevicePlan
from leap_finetune.launch.facts import run_facts
from leap_finetune.methods import method_of
from leap_finetune.runs.processes import NO_MULTICAST


def server_processes(devices: DevicePlan, resolved) -> list[dict]:
    """GRPO's local servers and distillation's teacher server, started by the driver before any training process
    (launch/rl_servers.py, launch/teacher_server.py)."""
    from leap_finetune.launch.rl_servers import judge_engine, local_servers

    listed = []
    for spec in local_servers(resolved, devices):
        if spec.name == "judge server":
            where = "CPU" if not devices.judge else "GPU"
            label = f"judge server ({judge_engine(devices)} serve, {where})"
        else:
            label = "rollout server (trl vllm-serve)"
        listed.append({"name": label, "node": 0, "command": spec.command, "env": spec.env, "port": spec.port})
    from leap_finetune.launch.teacher_server import teacher_engine, teacher_servers

    for spec in teacher_servers(resolved, devices):
        label = f"teacher server ({teacher_engine(devices)} serve, GPU)"
        listed.append({"name": label, "node": 0, "command": spec.command, "env": spec.env, "port": spec.port})
    return listed


def processes(devices: DevicePlan, config_path: str | None, resolved=None) -> list[dict]:
    """Every process the run would start, with its command and CUDA_VISIBLE_DEVICES (device indices
    as the driver sees them): servers first, then training."""
    servers = server_processes(devices, resolved) if resolved is not None else []
    overrides = list(getattr(resolved, "overrides", None) or [])
    return servers + _training_processes(devices, config_path, overrides) + _evaluation_processes(devices, resolved)


def _evaluation_processes(devices: DevicePlan, resolved) -> list[dict]:
    """async_eval: what the driver starts at each evaluation rank 0 hands over (launch/evaluator.py)."""
    settings = getattr(resolved, "async_eval", None)
    if settings is None or settings.mode == "sync":
        return []
    from leap_finetune.runs.processes import NO_MULTICAST

    snapshot = "RUN/benchmarks/snapshots/step-N"
    # the same points as sync mode (recipes/common.benchmark_callback)
    every = (resolved.evals.eval_steps if resolved.evals else None) or resolved.training.get("eval_steps") or 500
    start = "" if resolved.resume_checkpoint_path else "before training, "
    when = f"{start}every {every} steps and after training"
    if settings.mode == "sidecar":
        cpu = not settings.vllm_gpus  # (evaluation/sidecar.py: a CPU evaluator yields to training)
        return [
            {
                "name": f"evaluation job (sbatch, one per evaluation, submitted by the driver: {when})",
                "node": 0,
                "command": [
                    "sbatch",
                    "RUN/benchmarks/jobs/step-N.sbatch",
                    "->",
                    *(["nice", "-n", "19"] if cpu else []),
                    "leap-finetune",
                    "eval",
                    f"{snapshot}/eval.yaml",
                ],
                "env": {},
            }
        ]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices.eval)), **NO_MULTICAST} if devices.eval else {}
    port = settings.reserved.server_port
    in_place = settings.reserved.weight_reload == "in_place"
    if in_place and devices.eval:  # (vLLM's reload endpoints: evaluation/reserved.py)
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return [
        {
            "name": (
                "evaluation server (started once; each snapshot's weights loaded into it"
                if in_place
                else "evaluation server (respawned by the driver on each snapshot"
            )
            + f": {when})",
            "node": 0,
            "env": env,
            "command": [
                *([] if devices.eval else ["nice", "-n", "19"]),  # (evaluation/reserved.py: on the CPU it yields)
                "python",
                "-m",
                "leap_finetune.evaluation.serve",
                f"{snapshot}/model",
                "--port",
                str(port),
                *(["(vLLM if installed)"] if devices.eval else []),  # (evaluation/reserved.use_vllm)
                "+",
                "leap-finetune",
                "eval",
                "--server",
                f"http://127.0.0.1:{port}/v1",
            ],
        }
    ]


def _training_processes(devices: DevicePlan, config_path: str | None, overrides: list[str]) -> list[dict]:
    # (the command as it would be typed: the --set overrides plan was given too, or the copied line runs another run)
    run = ["leap-finetune", "run", config_path or "CONFIG.yaml", *(a for o in overrides for a in ("--set", o))]
    if devices.own_process:
        return [
            {"name": "driver (prepares data, starts the servers, waits)", "node": 0, "command": run, "env": {}},
            {
                "name": "train (one process, sees only its GPU)",
                "node": 0,
                "command": ["python", "-m", "leap_finetune.launch.single", "PAYLOAD.json"],
                "env": {"CUDA_VISIBLE_DEVICES": str(devices.training[0]), **NO_MULTICAST},
            },
        ]
    if devices.in_process:
        env = {"CUDA_VISIBLE_DEVICES": str(devices.training[0])} if devices.use_gpu else {}
        return [{"name": "train", "node": 0, "command": run, "env": env}]
    ids = ",".join(str(i) for i in devices.training)
    driver_env = {**({"CUDA_VISIBLE_DEVICES": ids} if devices.use_gpu else {}), **NO_MULTICAST}
    listed = [{"name": "driver (prepares data, starts Ray Train, waits)", "node": 0, "command": run, "env": driver_env}]
    if not devices.address:
        listed.append(
            {
                "name": "ray (local instance, started by the driver)",
                "node": 0,
                "command": ["ray.init", f"num_gpus={len(devices.training) if devices.use_gpu else 0}"],
                "env": driver_env,
            }
        )
    per_node = max(1, devices.workers // devices.nodes)
    for rank in range(devices.workers):
        node, local = divmod(rank, per_node)
        env = {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(devices.workers), **NO_MULTICAST}
        if devices.use_gpu:
            env["CUDA_VISIBLE_DEVICES"] = str(devices.training[local % len(devices.training)])
        listed.append(
            {
                "name": f"training worker rank {rank}",
                "node": node,
                "command": ["ray::RayTrainWorker", "leap_finetune.launch.worker.train_worker"],
                "env": env,
            }
        )
    return listed


def plan_report(resolved, devices: DevicePlan, prepared, no_tokens: str = "", budget: int | None = None) -> dict:
    """`no_tokens`: why the rows were counted without the tokenizer (prepared.tokenized is False); `budget`: the
    GPU memory to plan for (bytes; --gpu-memory, gpu_memory:)."""
    from leap_finetune.memory.budget import process_memory

    budget = budget if budget is not None else resolved.gpu_memory
    memory = process_memory(resolved, devices, prepared, budget)
    fitted = memory.get("fitted")
    as_written = resolved  # (a refusal's alternatives start from the config, not from the fitting's changes)
    if fitted is not None and fitted.changes:  # (the plan of the run as it will train: with the defaults that fit)
        resolved = resolved.model_copy(update={"training": fitted.training})
    t = resolved.training
    rows = len(prepared.train)
    facts = run_facts(resolved, prepared, devices)
    steps = facts.epoch
    tokens_per_row = prepared.train_tokens / rows if rows else 0
    return {
        **devices.to_json(),
        "batch": {
            "per_device": facts.micro_batch,
            "gradient_accumulation_steps": facts.accumulation,
            "workers": facts.workers,
            "global": steps.per_step,
            "global_is_mean": steps.approximate,  # batch_tokens: the rows of a step follow their lengths
            "unit": steps.unit,
            "detail": steps.per_step_detail,
        },
        "rows": rows,
        "steps_per_epoch": steps.steps_per_epoch,
        "max_steps": facts.max_steps,
        "total_steps": facts.total_steps,
        "precision": facts.precision,
        "device": facts.device,  # cpu, gpu, or mps (an Apple Silicon GPU)
        # GRPO: the prompts' tokens of a step's completions (the completions add up to max_completion_length each)
        "tokens_per_step": round(tokens_per_row * steps.per_step) if prepared.tokenized else None,
        "tokens_not_counted": None if prepared.tokenized else _why_no_tokens(resolved, no_tokens),
        "sampling": (
            f"each prompt {t.get('num_generations', 8)} times (GRPO's groups)"
            if method_of(resolved).rewards
            else "batch_tokens: micro-batches grouped by their rows' tokens, in a new order each epoch"
            if t.get("batch_tokens")
            else t.get("train_sampling_strategy", "random")
        ),
        "last_batch": steps.last_batch,
        # several DDP workers: the precision of their gradients' all-reduce (config/communication.py)
        "gradient_all_reduce": None if devices.in_process or t.get("fsdp") else planned_all_reduce(t),
        "gradient_communication_unused": (
            ONE_PROCESS if devices.in_process and t.get("gradient_communication") == "bf16" else None
        ),
        "trains": _trains(resolved),
        "teacher": _teacher(resolved),
        "rollouts": _rollouts(resolved),
        "processes": _with_memory(processes(devices, resolved.config_path, resolved), memory, resolved, devices),
        "memory_budget": _budget_json(as_written, fitted, memory.get("longest_row")),
        "unused_settings": _unused(resolved, prepared),
    }


def _unused(resolved, prepared) -> list[str]:
    """Settings that would do nothing in this run (validate/no_effect.py)."""
    from leap_finetune.validate.no_effect import data_notes

    return [*resolved.config_notes, *data_notes(resolved, prepared)]


def _with_memory(listed: list[dict], memory: dict, resolved, devices: DevicePlan) -> list[dict]:
    """Each process's predicted peak GPU memory (`memory`, with `memory_note` where part of it cannot be counted):
    the training processes' (memory/plan.py, the fitting's when a budget is given), the servers' (memory/servers.py);
    None for a process on the CPU (the driver and Ray's never create a CUDA context)."""
    predicted = memory["memory"]
    if memory.get("fitted") is not None:
        predicted = memory["fitted"].memory
    for process in listed:
        name = process["name"]
        if name.startswith(("train", "training worker")):
            found, note = predicted, memory.get("note") or memory.get("why", "")
        elif devices.use_gpu:
            found, note = _server_memory(name, resolved, devices, memory.get("gpu_bytes"))
        else:
            found, note = None, ""
        process["memory"] = found.to_json() if found is not None else None
        if note:
            process["memory_note"] = note
    return listed


def _server_memory(name: str, resolved, devices: DevicePlan, gpu_bytes: int | None):
    """(Memory or None, note) of a server process the driver starts, by its name in `processes`."""
    from leap_finetune.memory import servers
    from leap_finetune.memory.plan import shape_of
    from leap_finetune.memory.shapes import model_shape

    if name.startswith("rollout server"):
        return servers.vllm_server(shape_of(resolved), resolved.grpo_rollout.gpu_memory_utilization, gpu_bytes)
    if name.startswith("judge server"):
        if not devices.judge:
            return None, ""
        shape = model_shape(resolved.rewards.judge.model)
        if "(vllm serve" in name:
            return servers.vllm_server(shape, resolved.grpo_rollout.gpu_memory_utilization, gpu_bytes)
        return servers.transformers_server(shape)
    settings = getattr(resolved, "async_eval", None)
    on_gpu = bool(settings.vllm_gpus) if name.startswith("evaluation job") else bool(devices.eval)
    if name.startswith("evaluation") and on_gpu:
        return servers.vllm_server(shape_of(resolved), settings.gpu_memory_utilization, gpu_bytes)
    return None, ""


def _budget_json(resolved, fitted, longest: int | None) -> dict | None:
    if fitted is None:
        return None
    from leap_finetune.memory.budget import does_not_fit, usable_bytes

    refusal = None if fitted.fits else does_not_fit(resolved, fitted, longest, where="gpu_memory")
    return {
        "budget_gib": round(fitted.budget / 2**30, 2),
        "usable_gib": round(usable_bytes(fitted.budget) / 2**30, 2),  # (CUDA's context and the allocator's slack)
        "fits": fitted.fits,
        "refusal": f"{refusal.message}; {refusal.fix}" if refusal is not None else None,
        "changes": [
            {"key": c.key, "value": c.value, "reason": c.reason, "peak_gib": round(c.peak / 2**30, 2)}
            for c in fitted.changes
        ],
    }


def _trains(resolved) -> dict | None:
    """A vision-language run: how each part trains (full, LoRA, frozen; the vision encoder's learning rate)."""
    if not resolved.vision:
        return None
    from leap_finetune.validate.vision import trained_parts

    return dict(trained_parts(resolved.training, resolved.peft))


def _rollouts(resolved) -> dict | None:
    """GRPO: the engine the config chose and the one measured faster for this model's size."""
    if not method_of(resolved).rewards:
        return None
    from leap_finetune.launch.reports.report import rollout_engine
    from leap_finetune.rl.engines import rollout_advice

    engine = rollout_engine(resolved)
    return {
        "engine": engine,
        "advice": rollout_advice(
            resolved.model_id,
            engine=engine,
            lora=resolved.peft is not None,
            vllm_mode=str(resolved.training.get("vllm_mode", "colocate")),
        ),
    }


def _why_no_tokens(resolved, no_tokens: str) -> str:
    cut = method_of(resolved).cut_by_max_length and resolved.training.get("max_length")
    return (
        (no_tokens or "the tokenizer is not at hand") + ", and plan does not download it; `leap-finetune validate` "
        "does, then plan counts them"
        + ("; the rows above include any that max_length would cut away entirely" if cut else "")
    )


def print_plan(console, report: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    devices = report["devices"]
    table = Table(title="devices", title_justify="left")
    for column in ("GPU", "role"):
        table.add_column(column)
    nodes = report["nodes"]
    for role in ("server", "judge", "eval", "training"):
        for index in devices[role]:
            table.add_row(
                str(index), role + (f" (on each of {nodes} nodes)" if role == "training" and nodes > 1 else "")
            )
    if report["gpus_per_node"]:
        console.print(table)
    else:
        console.print("devices: Apple GPU (mps)" if report.get("device") == "mps" else "devices: CPU only")
    batch = report["batch"]
    mode = (
        ("one training process beside the driver (no Ray)" if report.get("own_process") else "in-process (no Ray)")
        if report["in_process"]
        else f"Ray Train, {report['backend']}"
        + (f", cluster at {report['address']}" if report["address"] else ", a local Ray instance")
    )
    all_reduce = report.get("gradient_all_reduce")
    console.print(
        f"workers: {report['workers']} on {nodes} node(s) - {mode}"
        + (f"; gradients all-reduced in {all_reduce}" if all_reduce else "")
        + (f"; {report['gradient_communication_unused']}" if report.get("gradient_communication_unused") else "")
    )
    grpo = batch["unit"] == "completions"
    console.print(
        f"batch: {batch['per_device']} per device x {batch['gradient_accumulation_steps']} accumulation x "
        f"{batch['workers']} worker(s) = {'~' if batch.get('global_is_mean') else ''}{batch['global']} "
        f"{batch['unit']} per step"
        + (f" ({batch['detail']})" if batch["detail"] else "")
        + f"; {report['rows']} {'prompts' if grpo else 'rows'} -> {report['steps_per_epoch']} steps per epoch"
        + (
            f" (max_steps {report['max_steps']})"
            if report["max_steps"] and report["max_steps"] > 0
            else f", {report['total_steps']} in all"
            if report["total_steps"] != report["steps_per_epoch"]
            else ""
        )
        + (
            f"; ~{report['tokens_per_step']:,} {'prompt ' if grpo else ''}tokens per step"
            if report["tokens_per_step"] is not None
            else ""
        )
    )
    if report["tokens_per_step"] is None:
        console.print(f"tokens: not counted ({escape(report['tokens_not_counted'])})")
    console.print(f"precision: {report['precision']}")
    console.print(
        f"sampling: {report['sampling']}"
        + (" (each step's rows dealt so workers get equal tokens)" if report["sampling"] == "batch_rebalance" else "")
    )
    if report["last_batch"]:
        console.print(report["last_batch"])
    if report.get("trains"):
        console.print("trains: " + ", ".join(f"{part} {how}" for part, how in report["trains"].items()))
    _print_teacher(console, report.get("teacher"))
    if report.get("rollouts"):
        console.print(f"rollouts: {escape(report['rollouts']['engine'])}; {escape(report['rollouts']['advice'])}")
    console.print("processes:")
    for process in report["processes"]:
        env = " ".join(f"{k}={v}" for k, v in process["env"].items())
        console.print(
            f"  [bold]{escape(process['name'])}[/bold] (node {process['node']}): "
            f"{escape(env + ' ' if env else '')}{escape(' '.join(process['command']))}"
        )
        if process.get("memory"):
            note = f"; {process['memory_note']}" if process.get("memory_note") else ""
            console.print(f"    GPU memory: {_memory_line(process['memory'])}{note}", markup=False)
        elif process.get("memory_note"):
            console.print(f"    GPU memory: not predicted: {process['memory_note']}", markup=False)
    _print_budget(console, report.get("memory_budget"))
    for note in report.get("unused_settings") or ():
        console.print(f"note: {note}", markup=False)


def _print_teacher(console, teacher: dict | None) -> None:
    if teacher:
        size = f", {teacher['weights_gib']:.1f} GiB in the training process's weights" if teacher["weights_gib"] else ""
        console.print(f"teacher: {teacher['model']} ({teacher['how']}{size})", markup=False)


def _teacher(resolved) -> dict | None:
    """distill: the teacher, where it runs, its bf16 weights (memory/plan.py counts them in the training process)."""
    if not resolved.distill:
        return None
    from leap_finetune.memory.plan import teacher_bytes

    d = resolved.distill
    where = "frozen, bf16 beside the student on its GPU"
    if d.get("teacher_base_url"):
        where = f"served at {d['teacher_base_url']}, its top {d['teacher_top_k']} log-probs per token"
    elif d.get("teacher_gpus"):
        where = f"served on {d['teacher_gpus']} GPU(s) of its own, its top {d['teacher_top_k']} log-probs per token"
    how = f"{where}; {d['mode']} {d['loss']}, temperature {d['temperature']:g}"
    return {"model": d["teacher"], "how": how, "weights_gib": round(teacher_bytes(resolved) / 2**30, 2)}


def _memory_line(memory: dict) -> str:
    parts = ("weights", "gradients", "optimizer", "activations", "other") + (("cache",) if memory["cache_gib"] else ())
    return f"~{memory['peak_gib']:.1f} GiB peak (" + ", ".join(f"{p} {memory[p + '_gib']:.1f}" for p in parts) + ")"


def _print_budget(console, budget: dict | None) -> None:
    if budget is None:
        return
    from leap_finetune.memory.budget import change_text

    for change in budget["changes"]:
        console.print(
            f"memory: {change_text(change['key'], change['value'])} ({change['reason']}): ~{change['peak_gib']:.1f} "
            "GiB",
            markup=False,
        )
    console.print(
        f"memory: fits the {budget['budget_gib']:.1f} GiB budget ({budget['usable_gib']:.1f} GiB for training: CUDA's "
        "context and the allocator's slack kept aside)"
        if budget["fits"]
        else f"memory: does NOT fit - `leap-finetune run` refuses it: {budget['refusal']}",
        markup=False,
    )
