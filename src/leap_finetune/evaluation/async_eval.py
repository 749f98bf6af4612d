"""Benchmarks that do not pause training: `async_eval.mode: sidecar` (one SLURM job per evaluation) and
`reserved` (an evaluation server on GPUs the driver kept out of training).

At each evaluation point (the same as sync mode: before training unless resuming, every `eval_steps`, after
the last step) rank 0 writes a snapshot of the model - a full model folder, LoRA merged, into a temporary
folder renamed when complete, so a half-written snapshot is never evaluated - and hands it to a background
thread; training continues at once. The thread runs `leap-finetune eval` on the snapshot (inside an sbatch
job, or against the respawned evaluation server) and returns an outcome. Outcomes are taken in on rank 0 at
the next step end and logged keyed by the TRAINING STEP of the snapshot: metrics.jsonl and every tracker get
the scores at that step, RUN/benchmarks/results/step-N.json holds them, and the snapshot is deleted.

One evaluation runs at a time; `on_overlap` says whether one that falls due meanwhile waits (queue, at most
MAX_WAITING snapshots on disk) or is skipped. A failed evaluation (rejected sbatch, a job that fails, is
cancelled or times out, a server that does not start or dies) is counted like a failed sync evaluation
(evaluation/callback.py), and never stops training.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.config.yaml_io import dump_yaml
from leap_finetune.errors import LeapError
from leap_finetune.evaluation.callback import EvaluationLog
from leap_finetune.launch.distributed import NO_MULTICAST

MAX_WAITING = 3  # snapshots waiting their turn (queue mode): bounded disk
POLL_S = 1.0
# A pending job with one of these reasons will not start by waiting (held, or over a limit of its partition,
# account or QOS): counted as a failed evaluation at once, not waited for until the end of training.
NEVER_STARTS = {"JobHeldUser", "JobHeldAdmin", "PartitionTimeLimit", "PartitionNodeLimit", "PartitionConfig",
                "PartitionDown", "PartitionInactive", "AccountNotAllowed", "InvalidAccount", "InvalidQOS",
                "QOSMaxWallDurationPerJobLimit", "QOSMaxGRESPerJob", "BadConstraints", "DependencyNeverSatisfied"}
FINISHED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}


@dataclass
class Snapshot:
    step: int
    when: str
    folder: Path  # model/ (a full model folder) and eval.yaml; results.json once evaluated
    epoch: float | None = None  # the trainer's epoch at that step (logged with the results)


@dataclass
class Outcome:
    results: dict | None = None
    reason: str | None = None  # why it failed
    log: Path | None = None  # where to read more


def check_async_eval(resolved: ResolvedConfig, devices) -> None:
    """The machine-dependent checks (validate and run): sbatch for sidecar; one node, and the server's
    packages, for reserved. `devices`: the device plan (launch/devices.py)."""
    mode = resolved.async_eval.mode if resolved.async_eval is not None else "sync"
    where = f"{resolved.config_path or 'config'}: async_eval.mode"
    if mode == "sidecar" and shutil.which("sbatch") is None:
        raise LeapError("async_eval.mode sidecar submits each evaluation with sbatch, which is not installed here",
                        where=where, fix="run on a SLURM cluster's node (where sbatch works), or use mode: reserved "
                        "(a GPU of this machine) or sync")
    if mode == "sidecar":
        _check_sbatch_accepts(resolved, where)
    if mode != "reserved":
        return
    if devices.address:
        raise LeapError(f"async_eval.mode reserved runs the evaluation server on GPUs of the driver's machine, and "
                        f"this run trains on the Ray cluster at {devices.address}", where=where,
                        fix="use mode: sidecar on a cluster, or run on one machine without ray.address")
    from leap_finetune.launch.servers import port_in_use

    port = resolved.async_eval.reserved.server_port
    if port_in_use("127.0.0.1", port):
        raise LeapError(f"port {port} is in use by another process: the evaluation server could not start there",
                        where=f"{resolved.config_path or 'config'}: async_eval.reserved.server_port",
                        fix="stop what listens there, or choose another server_port")
    if devices.nodes > 1:
        raise LeapError(f"async_eval.mode reserved runs the evaluation server on one node, and this run spans "
                        f"{devices.nodes} nodes", where=where, fix="use mode: sidecar for multi-node training")
    from leap_finetune.evaluation.standalone import check_benchmarks

    with_images = [b.name for b in check_benchmarks(resolved) if any(item.images for item in b.items)]
    if with_images:
        raise LeapError(f"benchmark(s) {', '.join(with_images)} have images, and the reserved evaluation server is "
                        "sent text messages only in this version", where=where,
                        fix="use mode: sidecar or sync for image benchmarks")
    if not _use_vllm(resolved):
        import importlib.util

        missing = [m for m in ("fastapi", "uvicorn", "openai") if importlib.util.find_spec(m) is None]
        if missing:
            raise LeapError(f"the reserved evaluation server (leap-finetune's own; vLLM is not installed) needs "
                            f"{', '.join(missing)}", where=where, fix="pip install 'leap-finetune[serve]' (or vllm)")


def _check_sbatch_accepts(resolved: ResolvedConfig, where: str) -> None:
    """`sbatch --test-only` on an evaluation job's script: a partition, account, time or extra option that SLURM
    would reject is an error now, not a failed evaluation at every eval step."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        script = folder / "check.sbatch"
        script.write_text(job_script(resolved, Snapshot(0, "check", folder), folder), encoding="utf-8")
        checked = subprocess.run(["sbatch", "--test-only", f"--output={folder}/check.out",
                                  *resolved.async_eval.sbatch.extra_args, str(script)],
                                 capture_output=True, text=True, timeout=120)
    if checked.returncode != 0:
        said = [line.strip() for line in (checked.stderr + checked.stdout).splitlines()
                if line.strip() and not line.startswith("Try ")]
        gpus = resolved.async_eval.vllm_gpus
        raise LeapError("sbatch would reject the evaluation jobs (checked with sbatch --test-only): " + "; ".join(said),
                        where=f"{resolved.config_path or 'config'}: async_eval.sbatch",
                        fix="fix async_eval.sbatch (partition, account, time, extra_args) for this cluster"
                        + (f"; each job asks for --gpus={gpus} (async_eval.vllm_gpus): a cluster without GPUs needs "
                           "vllm_gpus: 0" if gpus else ""))


def _use_vllm(resolved: ResolvedConfig) -> bool:
    import importlib.util

    return resolved.async_eval.vllm_gpus > 0 and importlib.util.find_spec("vllm") is not None


class AsyncBenchmarks(EvaluationLog):
    """The callback of sidecar and reserved mode (rank 0 takes the snapshots and the outcomes)."""

    def __init__(self, resolved: ResolvedConfig, run_dir: Path, console, every: int, template_text: str):
        super().__init__(run_dir, console, every, resolved.async_eval.failure.max_consecutive)
        self.resolved = resolved
        self.settings = resolved.async_eval
        self.template_text = template_text  # the chat template the benchmarks render with (saved with snapshots)
        self.snapshots = run_dir / "benchmarks" / "snapshots"
        self.jobs = run_dir / "benchmarks" / "jobs"
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="leap-eval")  # one at a time, in order
        self.pending: list[tuple[Snapshot, Future]] = []
        self.run = sidecar_job if self.settings.mode == "sidecar" else ReservedServer(resolved, run_dir)
        self.finished: dict[int, dict] = {}
        self.epoch: float | None = None  # the epoch of the snapshot whose outcome is being logged
        self.training_ended = False

    # -- taking snapshots ------------------------------------------------------------------------------------
    def evaluate(self, when: str) -> dict:
        trainer = self.trainer
        step = trainer.state.global_step
        self.take_outcomes()
        if self.last_step == step or self.switched_off:
            return {}
        self.last_step = step
        busy = [p for p in self.pending if not p[1].done()]
        final = when == "after training"
        if busy and not final and (self.settings.on_overlap == "skip" or len(busy) > MAX_WAITING):
            why = "on_overlap: skip" if self.settings.on_overlap == "skip" else f"{MAX_WAITING} snapshots already wait"
            self.console.print(f"[yellow]evaluation of step {step} skipped: the evaluation of step "
                               f"{busy[0][0].step} still runs ({why})[/yellow]")
            return {}
        try:
            snapshot = self._snapshot(step, when)
        except Exception as err:  # noqa: BLE001 - a full disk while snapshotting must not stop training
            shutil.rmtree(self.snapshots / f".step-{step}.tmp", ignore_errors=True)
            self._failed(step, when, f"{type(err).__name__}: {err}", None, err)
            return {}
        future = self.pool.submit(self._evaluate_guarded, snapshot)
        self.pending.append((snapshot, future))
        self.console.print(f"evaluation of step {step} ({when}) handed to the {self.settings.mode} evaluator"
                           + (f"; {len(busy)} evaluation(s) ahead of it" if busy else ""))
        return {}

    def _snapshot(self, step: int, when: str) -> Snapshot:
        """RUN/benchmarks/snapshots/step-N: model/ and eval.yaml, renamed into place when complete."""
        final = self.snapshots / f"step-{step}"
        staging = self.snapshots / f".step-{step}.tmp"
        for old in (staging, final):
            if old.exists():
                shutil.rmtree(old)
        staging.mkdir(parents=True)
        save_full_model(self.trainer, staging / "model", self.template_text)
        evals = self.resolved.evals.model_dump(mode="json", exclude_none=True)
        config = {"project_name": f"{self.resolved.project_name}-eval", "model_name": self.resolved.model_id,
                  "chat_template": self.resolved.chat_template, "checkpoint": str(final), "evals": evals}
        (staging / "eval.yaml").write_text(dump_yaml(config), encoding="utf-8")
        os.replace(staging, final)
        return Snapshot(step, when, final, self.trainer.state.epoch)

    def _evaluate_guarded(self, snapshot: Snapshot) -> Outcome:
        if self.stop_event.is_set():
            return Outcome(reason="stopped before it started")
        try:
            return self.run(self.resolved, snapshot, self.jobs, self.stop_event)
        except Exception as err:  # noqa: BLE001 - reported as a failed evaluation
            return Outcome(reason=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")

    # -- taking outcomes (rank 0, between steps) -------------------------------------------------------------
    def take_outcomes(self) -> None:
        while self.pending and self.pending[0][1].done():
            snapshot, future = self.pending.pop(0)
            outcome = future.result()
            self.epoch = snapshot.epoch
            if outcome.results is not None:
                self._succeeded(snapshot, outcome.results)
            elif not self.switched_off:
                self._failed(snapshot.step, snapshot.when, outcome.reason, outcome.log)
            shutil.rmtree(snapshot.folder, ignore_errors=True)
        if self.switched_off:
            self._cancel_waiting()

    def _succeeded(self, snapshot: Snapshot, results: dict) -> None:
        self.failures_in_a_row = 0
        self.finished[snapshot.step] = results
        current = self.trainer.state.global_step
        late = (", arrived after training" if self.training_ended and current != snapshot.step else
                f", arrived at step {current}" if current != snapshot.step else "")
        from leap_finetune.evaluation.runner import print_summary

        print_summary(self.console, results, None, f"of step {snapshot.step} ({snapshot.when}; {self.settings.mode}{late})")
        self.log_at(snapshot.step, dict(results))
        self.write_results(snapshot.step, snapshot.when, results)
        for predictions in (snapshot.folder / "predictions").glob("*.jsonl"):  # the newest evaluation's
            os.replace(predictions, self.predictions_dir / predictions.name)

    def log_at(self, step: int, logs: dict) -> None:
        """Log to metrics.jsonl and every tracker at training step `step` (the snapshot's), not at the step
        the results arrived: the callbacks get the trainer's state with that step."""
        trainer = self.trainer
        state = copy.copy(trainer.state)
        state.global_step, state.epoch = step, self.epoch
        trainer.state.log_history.append({**logs, "step": step})
        trainer.callback_handler.on_log(trainer.args, state, trainer.control, logs)

    def _cancel_waiting(self) -> None:
        for snapshot, future in list(self.pending):
            if future.cancel():
                self.pending.remove((snapshot, future))
                shutil.rmtree(snapshot.folder, ignore_errors=True)

    # -- the end -----------------------------------------------------------------------------------------------
    def finish(self, *, wait: bool) -> dict[int, dict]:
        """After training: wait (at most wait_at_end_s) for the evaluations still running and log their
        results; stopped early (or past the wait), stop them. Returns every evaluation's results by step."""
        self.training_ended = True
        if wait and self.pending:
            left = [s.step for s, f in self.pending]
            self.console.print(f"waiting for {len(left)} evaluation(s) still running or queued (steps "
                               f"{', '.join(map(str, left))}; at most {self.settings.wait_at_end_s:g} s)")
            deadline = time.monotonic() + self.settings.wait_at_end_s
            while self.pending and time.monotonic() < deadline:
                self.take_outcomes()
                time.sleep(POLL_S / 2)
        self.take_outcomes()
        if self.pending:
            self.stop_event.set()
            steps = ", ".join(str(s.step) for s, _ in self.pending)
            self.console.print(f"[yellow]evaluations of step(s) {steps} stopped unfinished "
                               + ("(training stopped early)" if not wait else
                                  f"(past async_eval.wait_at_end_s = {self.settings.wait_at_end_s:g} s)")
                               + "[/yellow]")
            self._cancel_waiting()
        self.pool.shutdown(wait=True)
        self.pending.clear()
        shutil.rmtree(self.snapshots, ignore_errors=True)
        return self.finished

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run (the checkpoint's weights and step are loaded by now): evaluations that had not reported
        when the run stopped lost their snapshots - said, not silent; the checkpoint's own step, if an evaluation
        was due there, is evaluated again now."""
        step = state.global_step
        if not state.is_world_process_zero or self.trainer is None or step == 0:
            return None
        done = {int(p.stem.split("-")[1]) for p in (self.predictions_dir / "results").glob("step-*.json")}
        lost = [s for s in range(0, step, self.every) if s not in done]
        if lost:
            self.console.print(f"note: evaluation(s) of step(s) {', '.join(map(str, lost))} have no results (failed, or "
                               "not finished when the run stopped; their snapshots are gone): not evaluated")
        if step % self.every == 0 and step not in done and step < state.max_steps:
            self.evaluate("at the resumed checkpoint")
        return None

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or self.trainer is None:
            return None
        self.take_outcomes()
        if state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.evaluate("during training")
        return None


def save_full_model(trainer, folder: Path, template_text: str) -> None:
    """The model as a plain from_pretrained folder (LoRA merged, without changing the training weights),
    with the tokenizer whose chat template is the one the benchmarks render with (an evaluation server applies
    the tokenizer's template)."""
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    save_model_folder(model, folder)
    tokenizer = trainer.processing_class
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
    tokenizer.save_pretrained(str(folder))
    (folder / "chat_template.jinja").write_text(template_text, encoding="utf-8")
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.exists():  # an older layout keeps the template inside the config too
        data = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        if "chat_template" in data:
            data["chat_template"] = template_text
            tokenizer_config.write_text(json.dumps(data, indent=2), encoding="utf-8")


def save_model_folder(model, folder: Path) -> None:
    """A model, or a peft model with its adapters merged, saved as a plain from_pretrained folder."""
    if not hasattr(model, "peft_config"):
        model.save_pretrained(str(folder))
        return
    base, state_dict = model.get_base_model(), merged_state_dict(model)
    config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    tied = bool(getattr(config, "tie_word_embeddings", False))
    output, embeddings = base.get_output_embeddings(), base.get_input_embeddings()
    names = {id(p): n for n, p in base.named_parameters(remove_duplicate=False)}
    head = next((n.replace(".base_layer", "").replace(".modules_to_save.default", "")
                 for n, p in base.named_parameters(remove_duplicate=False)
                 if p is getattr(output, "weight", None)), None) if output is not None else None
    embed = names.get(id(getattr(embeddings, "weight", None)))
    untie = tied and head in state_dict and embed in state_dict and not torch_equal(state_dict[head], state_dict[embed])
    if untie:  # the adapter changed the output head or the embeddings apart: saved as two matrices (as peft does)
        config.tie_word_embeddings = False
    try:
        base.save_pretrained(str(folder), state_dict=state_dict)
    finally:
        if untie:
            config.tie_word_embeddings = True


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a, b))


def merged_state_dict(model) -> dict:
    """The weights of a peft LoRA model with every adapter merged, as the base model's own state dict. Each
    LoRA layer is merged on a copy of that layer only (peft's own merge: DoRA and scaling included), so the
    training weights are not touched and memory grows by one layer, not one model."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged_layers = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            layer = copy.deepcopy(module)
            layer.merge()
            for key, value in layer.get_base_layer().state_dict().items():
                merged_layers[f"{name}.{key}"] = value
    state = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key or "lora_magnitude_vector" in key or ".original_module." in key:
            continue
        key = key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        state[key] = value
    state.update(merged_layers)
    return {k: v.detach().contiguous() for k, v in state.items()}


# -- sidecar: one sbatch job per evaluation -------------------------------------------------------------------
def job_script(resolved: ResolvedConfig, snapshot: Snapshot, jobs: Path) -> str:
    """The sbatch script of one evaluation: `leap-finetune eval` on the snapshot with vllm_gpus GPUs (a vLLM
    server inside the job answers the generation benchmarks when vLLM is installed there)."""
    from leap_finetune.models.vision import is_vision_model

    settings = resolved.async_eval
    python = shlex.quote(sys.executable)
    run = re.sub(r"[^A-Za-z0-9._-]", "_", Path(resolved.run_dir).name if resolved.run_dir else resolved.project_name)
    # (#SBATCH lines are not shell words: a path with a space cannot be quoted there - sbatch gets --output on
    # its command line instead, see sidecar_job)
    directives = [f"--job-name=leap-eval-{run}-step-{snapshot.step}", "--ntasks=1", f"--time={settings.sbatch.time}"]
    if settings.vllm_gpus:
        directives.append(f"--gpus={settings.vllm_gpus}")
    for key, value in (("partition", settings.sbatch.partition), ("account", settings.sbatch.account)):
        if value:
            directives.append(f"--{key}={value}")
    exports = " ".join(f"{k}={v}" for k, v in NO_MULTICAST.items())
    # A CPU evaluator (vllm_gpus: 0) may share the training machine's cores: it yields to training (nice).
    nice = "" if settings.vllm_gpus else "nice -n 19 "
    folder = shlex.quote(str(snapshot.folder))
    eval_cmd = (f'{nice}"$PYTHON" -m leap_finetune.cli eval {folder}/eval.yaml --output {folder}/results.json')
    lines = ["#!/bin/bash",
             f"# leap-finetune: the evaluation of training step {snapshot.step} of {resolved.run_dir} (sidecar).",
             *[f"#SBATCH {d}" for d in directives], "", "set -euo pipefail", f"export {exports}",
             f"PYTHON={python}", f"cd {folder}"]
    if not settings.vllm_gpus:  # a CPU evaluator: no GPU (not the trainer's, inherited), the CPUs SLURM gave it
        lines += ["export CUDA_VISIBLE_DEVICES=", "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}"]
    # vLLM answers text generation; a vision-language model's image rows are not sent to servers
    if settings.vllm_gpus and not is_vision_model(resolved.model_id):
        lines += [
            "# vLLM answers the generation benchmarks when it is installed; otherwise transformers generates.",
            'if "$PYTHON" -c "import vllm" 2>/dev/null; then',
            "  port=$((20000 + SLURM_JOB_ID % 20000))",
            f'  "$PYTHON" -m vllm.entrypoints.openai.api_server --model {folder}/model --host 127.0.0.1 '
            f'--port "$port" --tensor-parallel-size {settings.tensor_parallel_size} --gpu-memory-utilization '
            f"{settings.gpu_memory_utilization} --served-model-name snapshot &",
            "  server=$!",
            '  trap \'kill "$server" 2>/dev/null || true\' EXIT',
            '  for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; '
            'kill -0 "$server" || exit 1; sleep 1; done',
            f'  {eval_cmd} --server "http://127.0.0.1:$port/v1" --server-model snapshot',
            "else",
            f"  {eval_cmd}",
            "fi"]
    else:
        lines.append(eval_cmd)
    return "\n".join(lines) + "\n"


def sidecar_job(resolved: ResolvedConfig, snapshot: Snapshot, jobs: Path, stop: threading.Event) -> Outcome:
    """Submit, then poll the job (scontrol) until it ends; COMPLETED with a results file is a success."""
    jobs.mkdir(parents=True, exist_ok=True)
    script = jobs / f"step-{snapshot.step}.sbatch"
    script.write_text(job_script(resolved, snapshot, jobs), encoding="utf-8")
    extra = list(resolved.async_eval.sbatch.extra_args)
    output = f"--output={jobs}/step-{snapshot.step}-%j.out"
    submitted = subprocess.run(["sbatch", "--parsable", output, *extra, str(script)], capture_output=True, text=True,
                               timeout=120)
    if submitted.returncode != 0:
        said = [line.strip() for line in (submitted.stderr + submitted.stdout).splitlines()
                if line.strip() and not line.startswith("Try ")]
        return Outcome(reason="sbatch rejected the job: " + ("; ".join(said) or f"exit code {submitted.returncode}"),
                       log=script)
    job = submitted.stdout.strip().split(";")[0]
    log = jobs / f"step-{snapshot.step}-{job}.out"
    results = snapshot.folder / "results.json"
    state, detail, reason = "PENDING", "", None
    while True:
        if stop.is_set():
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
            return Outcome(reason=f"SLURM job {job} cancelled while {state}" + (f" ({detail})" if detail else ""),
                           log=log)
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=60)
        if shown.returncode == 0:
            found = re.search(r"JobState=(\S+)", shown.stdout)
            state = found.group(1) if found else state
            reason = re.search(r"Reason=(\S+)", shown.stdout)
            code = re.search(r"ExitCode=(\S+)", shown.stdout)
            detail = ", ".join(x for x in (f"exit code {code.group(1)}" if code else "",
                                           f"reason {reason.group(1)}" if reason and reason.group(1) != "None" else "")
                               if x)
        elif "Invalid job id" in shown.stderr:  # finished and already purged by the controller
            state = "COMPLETED" if results.exists() else "GONE"
        if state in FINISHED_STATES or state == "GONE":
            break
        if state == "PENDING" and reason and reason.group(1) in NEVER_STARTS:
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
            return Outcome(reason=f"SLURM job {job} cannot start (Reason={reason.group(1)}); it was cancelled",
                           log=script)  # (the job never ran: its script is the thing to read)
        time.sleep(POLL_S)
    if state == "COMPLETED" and results.exists():
        return Outcome(results=json.loads(results.read_text(encoding="utf-8"))["results"], log=log)
    if state == "COMPLETED":
        return Outcome(reason=f"SLURM job {job} completed without writing results", log=log)
    return Outcome(reason=f"SLURM job {job} ended {state}" + (f" ({detail})" if detail else ""), log=log)


# -- reserved: an evaluation server on GPUs of its own --------------------------------------------------------
class ReservedServer:
    """For each snapshot: the evaluation server (vLLM where installed, else evaluation/serve.py: batched
    generation as in sync mode) is (re)started on it (`weight_reload: respawn`) on the reserved GPUs,
    `leap-finetune eval --server` runs against it (its log-prob benchmarks on the same GPUs), and the server is
    stopped."""

    def __init__(self, resolved: ResolvedConfig, run_dir: Path):
        self.devices = resolved.eval_devices or ""  # physical ids, decided by the driver ("" on CPU)

    def server_command(self, resolved: ResolvedConfig, model: Path, port: int) -> list[str]:
        settings = resolved.async_eval
        if _use_vllm(resolved):
            return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host",
                    "127.0.0.1", "--port", str(port), "--tensor-parallel-size", str(settings.tensor_parallel_size),
                    "--gpu-memory-utilization", str(settings.gpu_memory_utilization), "--served-model-name", "snapshot"]
        return [sys.executable, "-m", "leap_finetune.evaluation.serve", str(model), "--host", "127.0.0.1",
                "--port", str(port), "--device", "cuda" if settings.vllm_gpus else "cpu",
                "--batch-size", str(resolved.evals.batch_size)]

    def __call__(self, resolved: ResolvedConfig, snapshot: Snapshot, jobs: Path, stop: threading.Event) -> Outcome:
        from leap_finetune.launch.servers import Server, ServerSpec

        settings = resolved.async_eval
        port = settings.reserved.server_port
        env = {"CUDA_VISIBLE_DEVICES": self.devices, **NO_MULTICAST}
        cpu = not settings.vllm_gpus
        if cpu:  # a CPU evaluator: one thread each, at the lowest priority - the cores stay with training
            env["OMP_NUM_THREADS"] = "1"
        spec = ServerSpec(name="evaluation server", port=port, env=env, start_timeout_s=settings.reserved.start_timeout_s,
                          command=(["nice", "-n", "19"] if cpu else []) + self.server_command(
                              resolved, snapshot.folder / "model", port))
        server_log = jobs / f"step-{snapshot.step}-server.log"
        server = Server(spec, server_log)
        try:
            try:
                server.start()
                server.wait_healthy()
            except LeapError as err:
                said = err.message.splitlines()[0].removeprefix("the evaluation server ")
                return Outcome(reason=f"the evaluation server {said}", log=server_log)
            log = jobs / f"step-{snapshot.step}.log"
            command = (["nice", "-n", "19"] if cpu else []) + [
                sys.executable, "-m", "leap_finetune.cli", "eval", str(snapshot.folder / "eval.yaml"),
                "--server", f"{server.url}/v1", "--output", str(snapshot.folder / "results.json")]
            if _use_vllm(resolved):
                command += ["--server-model", "snapshot"]
            with log.open("ab") as handle:
                client = subprocess.Popen(command, env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
                while client.poll() is None:
                    if stop.is_set():
                        client.kill()
                        client.wait()
                        return Outcome(reason="stopped (training ended)", log=log)
                    time.sleep(POLL_S / 2)
            results = snapshot.folder / "results.json"
            if client.returncode == 0 and results.exists():
                return Outcome(results=json.loads(results.read_text(encoding="utf-8"))["results"], log=log)
            alive = "" if server.process.poll() is None else f"; the server had exited (log: {server_log})"
            return Outcome(reason=f"leap-finetune eval exited with code {client.returncode}{alive}: "
                           f"{_last_line(log)}", log=log)
        finally:
            server.stop()


def _last_line(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"
