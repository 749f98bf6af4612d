"""async_eval's evaluators on one GPU with vLLM (issue #25): the exact commands a training run starts, on a snapshot
of a model, without the training beside them (one GPU cannot hold both: reserved mode takes its GPUs out of
training, and SLURM is not on the GPU machine).

python bench/async_eval_vllm.py --out DIR [--arch 350m] [--smoke]

- reserved: evaluation/reserved.py's ReservedServer on the snapshot - the vLLM OpenAI server it starts
  (`vllm.entrypoints.openai.api_server ... --served-model-name snapshot`, async_eval.vllm_gpus: 1), then
  `leap-finetune eval --server ... --server-model snapshot` against it (the log-prob benchmark on the same GPU),
  then the server stopped;
- sidecar: evaluation/sidecar.py's sbatch script for the snapshot, run by bash with SLURM's variables set (its vLLM
  branch: the server inside the job, curl until healthy, eval --server, the server killed on exit);
- sync: `leap-finetune eval` on the same snapshot in-process (transformers), the reference scores.
The quickstart's two benchmarks (capitals: generation, exact match; capitals_mcq: log-prob multiple choice) on a
random-weight LFM2 architecture (bench/sft_throughput.py's build_model): the scores are near zero and equal only
where decoding agrees; what is measured is that each path runs end to end, its wall time and server start-up.
- in_place (`--modes in_place`): `weight_reload: in_place` - one server started on snapshot A, then snapshot B (A's
  weights moved by noise) loaded into it through the requests the driver sends (vLLM's /collective_rpc
  reload_weights, /reset_prefix_cache); the same prompts asked of it before and after the reload (a stale prefix
  cache would answer with A's keys and values), then a fresh server started on B: B's answers and scores must be
  equal from both, and differ from A's. Wall times: start + evaluation, reload + evaluation.
--smoke: on a CPU, tiny-lfm2 and vllm_gpus: 0 (leap-finetune's own evaluation server, no vLLM).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from leap_finetune.runs.processes import NO_MULTICAST  # noqa: E402 - the project's own (NVLink multicast off)

VLLM_ENV = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def model_folder(arch: str, work: Path) -> Path:
    folder = work / f"lfm2-{arch}"
    if (folder / "config.json").exists():
        return folder
    if arch == "tiny":
        from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

        tokenizer = load_tiny_tokenizer("tiny-lfm2")
        build_tiny_model("tiny-lfm2", tokenizer).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    else:
        from sft_throughput import build_model

        build_model(arch, folder)
    return folder


def config(model: Path, work: Path, gpus: int) -> dict:
    data = ROOT / "examples" / "data"
    return {
        "project_name": "async-eval-vllm",
        "model_name": str(model),
        "training_type": "sft",
        "dataset": {"path": str(data / "quickstart.jsonl")},
        "evals": {
            "max_new_tokens": 24,
            "batch_size": 16,
            "benchmarks": [
                {"name": "capitals", "path": str(data / "quickstart_bench_generation.jsonl"), "metric": "exact_match"},
                {"name": "capitals_mcq", "path": str(data / "quickstart_bench_mcq.jsonl"), "metric": "logprob_mcq"},
            ],
        },
        "async_eval": {
            "mode": "reserved",
            "vllm_gpus": gpus,
            "gpu_memory_utilization": 0.3,
            "reserved": {"server_port": 8137, "start_timeout_s": 400},
        },
    }


def snapshot(resolved, model: Path, work: Path, step: int):
    """RUN/benchmarks/snapshots/step-N as async_eval.py writes it: model/ and eval.yaml."""
    from leap_finetune.config.yaml_io import dump_yaml
    from leap_finetune.evaluation.snapshot import Snapshot

    folder = work / "snapshots" / f"step-{step}"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(model, folder / "model")
    evals = resolved.evals.model_dump(mode="json", exclude_none=True)
    (folder / "eval.yaml").write_text(
        dump_yaml(
            {
                "project_name": f"{resolved.project_name}-eval",
                "model_name": resolved.model_id,
                "chat_template": resolved.chat_template,
                "checkpoint": str(folder),
                "evals": evals,
            }
        ),
        encoding="utf-8",
    )
    return Snapshot(step, "bench", folder)


def scores(results: dict | None) -> dict:
    return {
        k.split("/")[1]: round(v, 4)
        for k, v in (results or {}).items()
        if k.startswith("benchmark/") and k.endswith("/score")
    }


def run_reserved(resolved, snap, jobs: Path) -> dict:
    from leap_finetune.evaluation.reserved import ReservedServer, use_vllm

    start = time.perf_counter()
    outcome = ReservedServer(resolved, jobs)(resolved, snap, jobs, threading.Event())
    server_log = jobs / f"step-{snap.step}-server.log"
    text = server_log.read_text(errors="replace") if server_log.exists() else ""
    return {
        "mode": "reserved",
        "wall_s": round(time.perf_counter() - start, 1),
        "vllm": use_vllm(resolved),
        "ok": outcome.results is not None,
        "reason": outcome.reason,
        "scores": scores(outcome.results),
        "server_command_is_vllm": "vllm.entrypoints.openai.api_server" in text.split("\n", 1)[0],
        "server_log_tail": text.splitlines()[-3:],
    }


PROMPTS = ["What is the capital of France?", "Name three colours.", "Count from one to five.", "Say hello."]


def ask(url: str, max_tokens: int = 4) -> list[list]:
    """Each prompt alone (no batching to vary the arithmetic), greedy: per generated token, its text and the top-5
    log-probs - a random-weight model's answers are often empty, its distributions are not."""
    import urllib.request

    answers = []
    for prompt in PROMPTS:
        body = {
            "model": "snapshot",
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
            "logprobs": True,
            "top_logprobs": 5,
        }
        request = urllib.request.Request(
            f"{url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as reply:
            choice = json.loads(reply.read())["choices"][0]
        tokens = (choice.get("logprobs") or {}).get("content") or []
        answers.append([[t["token"], [round(top["logprob"], 3) for top in t["top_logprobs"]]] for t in tokens])
    return answers


def close(a, b, tolerance: float = 0.05) -> bool:
    """The same tokens, and top-5 log-probs within `tolerance` (bf16 arithmetic of two loads)."""
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if len(x) != len(y) or [t for t, _ in x] != [t for t, _ in y]:
            return False
        for (_, p), (_, q) in zip(x, y):
            if len(p) != len(q) or any(abs(u - v) > tolerance for u, v in zip(p, q)):
                return False
    return True


def moved(model: Path, work: Path, noise: float) -> Path:
    """`model` with every floating weight moved by noise (seeded): the same architecture, other answers."""
    import torch
    from safetensors.torch import load_file, save_file

    folder = work / f"{model.name}-moved"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(model, folder)
    generator, scale = torch.Generator().manual_seed(7), noise
    for file in folder.glob("*.safetensors"):
        tensors = load_file(file)
        for name, value in tensors.items():
            if value.is_floating_point():
                noise = torch.randn(value.shape, generator=generator, dtype=torch.float32)
                tensors[name] = (value.float() + scale * value.float().std() * noise).to(value.dtype)
        save_file(tensors, file, metadata={"format": "pt"})
    return folder


def predictions(snap) -> list:
    folder = snap.folder / "results.predictions"
    return [json.loads(line)["prediction"] for line in (folder / "capitals.jsonl").open()] if folder.is_dir() else []


def run_in_place(resolved, model: Path, work: Path, jobs: Path, noise: float) -> dict:
    from leap_finetune.evaluation.reserved import ReservedServer, use_vllm

    resolved = resolved.model_copy(
        update={
            "async_eval": resolved.async_eval.model_copy(
                update={"reserved": resolved.async_eval.reserved.model_copy(update={"weight_reload": "in_place"})}
            )
        }
    )
    from leap_finetune.evaluation.reserved import _post

    other = moved(model, work, noise)
    stop = threading.Event()
    kept = ReservedServer(resolved, jobs)
    start = time.perf_counter()
    snaps = [snapshot(resolved, m, work, step=s) for m, s in ((model, 101), (other, 102), (other, 103))]
    first = kept(resolved, snaps[0], jobs, stop)
    first_wall = time.perf_counter() - start
    before = ask(kept.kept.url) if kept.kept else None
    start = time.perf_counter()
    second = kept(resolved, snaps[1], jobs, stop)
    second_wall = time.perf_counter() - start
    reloaded = ask(kept.kept.url) if kept.kept else None
    started = kept.started
    stale = None
    if kept.kept:  # A's weights again without emptying the prefix cache: are B's cached keys and values reused?
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(snaps[0].folder / "model")}}
        stale = _post(f"{kept.kept.url}/collective_rpc", body, 300) or ask(kept.kept.url)
    kept.close()
    fresh_jobs = jobs / "fresh"
    fresh_jobs.mkdir(exist_ok=True)
    fresh = ReservedServer(resolved, fresh_jobs)
    start = time.perf_counter()
    third = fresh(resolved, snaps[2], fresh_jobs, stop)
    third_wall = time.perf_counter() - start
    expected = ask(fresh.kept.url) if fresh.kept else None
    fresh.close()
    log = (jobs / "server.log").read_text(errors="replace") if (jobs / "server.log").exists() else ""
    same = close(reloaded, expected)
    return {
        "mode": "reserved, weight_reload: in_place",
        "vllm": use_vllm(resolved),
        "ok": bool(first.results and second.results and third.results and same and before != expected),
        "reason": "; ".join(o.reason for o in (first, second, third) if o.reason) or None,
        "servers_started": started,
        "wall_s": round(first_wall + second_wall, 1),
        "start_and_eval_s": round(first_wall, 1),
        "reload_and_eval_s": round(second_wall, 1),
        "reload_s": round(second_wall - (second.seconds or 0), 1),
        "fresh_start_and_eval_s": round(third_wall, 1),
        "scores": scores(second.results),
        "fresh_scores": scores(third.results),
        "answers_equal_fresh_server": same,
        "answers_changed_by_reload": not close(before, reloaded),
        "benchmark_predictions_equal_fresh": predictions(snaps[1]) == predictions(snaps[2]),
        "predictions_changed_by_reload": predictions(snaps[0]) != predictions(snaps[1]),
        "A_reloaded_again_without_cache_reset_answers_as_A": close(stale, before),
        "answers": {"A": before, "B reloaded": reloaded, "B fresh": expected, "A again, cache kept": stale},
        "server_log_tail": log.splitlines()[-5:],
    }


def run_sidecar(resolved, snap, jobs: Path) -> dict:
    from leap_finetune.evaluation.sidecar import job_script

    script = jobs / f"step-{snap.step}.sbatch"
    script.write_text(job_script(resolved, snap, jobs), encoding="utf-8")
    log = jobs / f"step-{snap.step}-sidecar.out"
    env = {**os.environ, **NO_MULTICAST, "SLURM_JOB_ID": "4242", "SLURM_CPUS_PER_TASK": "4"}
    start = time.perf_counter()
    with log.open("wb") as handle:
        done = subprocess.run(["bash", str(script)], env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=900)
    results = snap.folder / "results.json"
    found = json.loads(results.read_text())["results"] if results.exists() else None
    text = log.read_text(errors="replace")
    return {
        "mode": "sidecar (the sbatch script, by bash)",
        "wall_s": round(time.perf_counter() - start, 1),
        "exit": done.returncode,
        "ok": done.returncode == 0 and found is not None,
        "scores": scores(found),
        "script_has_vllm_branch": "vllm.entrypoints.openai.api_server" in script.read_text(),
        "log_says_vllm": "Application startup complete" in text,
        "log_tail": text.splitlines()[-3:],
    }


def run_sync(snap, jobs: Path) -> dict:
    output = jobs / "sync-results.json"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "leap_finetune.cli", "eval", str(snap.folder / "eval.yaml"), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    found = json.loads(output.read_text())["results"] if output.exists() else None
    return {
        "mode": "sync (leap-finetune eval, transformers in-process)",
        "wall_s": round(time.perf_counter() - start, 1),
        "exit": done.returncode,
        "ok": found is not None,
        "scores": scores(found),
        "log_tail": (done.stderr or done.stdout).splitlines()[-3:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--arch", default="350m", choices=["350m", "1.2b"])
    parser.add_argument("--work", default="/tmp/leap-async-eval-vllm")
    parser.add_argument("--modes", default="reserved,sidecar,sync")
    parser.add_argument("--noise", type=float, default=0.05, help="in_place: snapshot B = A + noise x std per tensor")
    parser.add_argument("--smoke", action="store_true", help="CPU: tiny-lfm2, vllm_gpus 0 (no vLLM)")
    args = parser.parse_args()
    os.environ.update({**NO_MULTICAST, **VLLM_ENV})
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    from leap_finetune.validate.loader import load_config

    arch = "tiny" if args.smoke else args.arch
    model = model_folder(arch, work)
    resolved = load_config(config(model, work, 0 if args.smoke else 1))
    resolved = resolved.model_copy(update={"eval_devices": "" if args.smoke else "0"})
    rows = []
    for n, mode in enumerate(args.modes.split(",")):
        snap = snapshot(resolved, model, work, step=n + 1)
        jobs = work / "jobs"
        jobs.mkdir(exist_ok=True)
        try:
            row = (
                run_in_place(resolved, model, work, jobs, 0.5 if args.smoke else args.noise)
                if mode == "in_place"
                else {"reserved": run_reserved, "sidecar": run_sidecar}[mode](resolved, snap, jobs)
                if mode != "sync"
                else run_sync(snap, jobs)
            )
        except Exception as err:  # noqa: BLE001 - a failed path is a row
            row = {"mode": mode, "ok": False, "reason": f"{type(err).__name__}: {str(err)[:300]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "async_eval_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    versions = {
        name: importlib.metadata.version(name) if importlib.util.find_spec(name) else "not installed"
        for name in ("torch", "vllm", "transformers")
    }
    lines = [
        f"### {datetime.date.today()} - async_eval evaluators with vLLM on one GPU - "
        f"{'CPU (smoke)' if args.smoke else 'GPU'} - {', '.join(f'{k} {v}' for k, v in versions.items())}",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        "| path | ok | wall s | scores | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        notes = "; ".join(
            f"{k}: {row[k]}"
            for k in (
                "vllm",
                "server_command_is_vllm",
                "script_has_vllm_branch",
                "log_says_vllm",
                "exit",
                "reason",
                "servers_started",
                "start_and_eval_s",
                "reload_and_eval_s",
                "reload_s",
                "fresh_start_and_eval_s",
                "answers_equal_fresh_server",
                "answers_changed_by_reload",
                "predictions_changed_by_reload",
                "benchmark_predictions_equal_fresh",
                "A_reloaded_again_without_cache_reset_answers_as_A",
            )
            if row.get(k) is not None
        )
        lines.append(f"| {row['mode']} | {row['ok']} | {row.get('wall_s', '-')} | {row.get('scores')} | {notes} |")
    (out / "async_eval_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
