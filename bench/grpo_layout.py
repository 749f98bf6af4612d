"""GRPO's GPU layout on a machine of 2 GPUs, through the real CLI: `grpo_rollout.judge_gpus: 1` puts the
judge server (transformers serve, started by the driver) on GPU 0 and training on GPU 1.

python bench/grpo_layout.py [--work /tmp/leap-grpo-layout]

Prints the plan, then samples nvidia-smi during the run (which process holds memory on which GPU), and
the judge's requests and failures from the run folder. The judge is the same random-weight LFM2-350M
architecture, so its answers rarely hold a number: failures are expected and counted; what this checks
is the layout, the server's start and stop, and that every completion reached the judge.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def gpu_processes() -> list[tuple[str, str, str]]:
    """(gpu index, pid, used MiB) of every compute process."""
    uuids = dict(
        line.split(", ")
        for line in subprocess.run(
            ["nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.splitlines()
    )
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    return [(uuids.get(uuid, uuid), pid, mem) for uuid, pid, mem in (line.split(", ") for line in apps)]


def command_of(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:90]
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", default="/tmp/leap-grpo-layout")
    args = parser.parse_args()
    from grpo_rollout import make_prompts
    from sft_throughput import build_model

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "lfm2-350m"
    build_model("350m", model)
    make_prompts(work / "prompts.jsonl", 64)
    config = {
        "project_name": "layout",
        "model_name": str(model),
        "training_type": "grpo",
        "dataset": {"path": "prompts.jsonl"},
        "rewards": {
            "funcs": [{"name": "length", "target_tokens": 64}],
            "judge": {
                "model": str(model),
                "prompt_template": "Grade 0-10: {completion}",
                "timeout_s": 30,
                "max_tokens": 8,
                "max_concurrency": 16,
            },
        },
        "grpo_rollout": {"judge_gpus": 1},
        "training_config": {
            "use_vllm": False,
            "max_steps": 4,
            "per_device_train_batch_size": 16,
            "num_generations": 8,
            "max_completion_length": 64,
            "logging_steps": 1,
            "save_strategy": "no",
        },
    }
    import yaml

    path = work / "layout.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = [sys.executable, "-m", "leap_finetune.cli"]
    plan = subprocess.run([*cli, "plan", str(path), "--json"], capture_output=True, text=True)
    print("plan rc", plan.returncode, plan.stderr[-500:])
    report = json.loads(plan.stdout)
    print("devices", report["devices"])
    for process in report["processes"]:
        print(
            f"  {process['name']}: CUDA_VISIBLE_DEVICES={process['env'].get('CUDA_VISIBLE_DEVICES')} "
            f"{' '.join(process['command'][:4])}"
        )

    seen: dict[tuple[str, str], str] = {}
    done = threading.Event()

    def sample():
        while not done.is_set():
            for gpu, pid, mem in gpu_processes():
                seen[(gpu, pid)] = f"{mem} {command_of(pid)}"
            time.sleep(1)

    threading.Thread(target=sample, daemon=True).start()
    start = time.perf_counter()
    run = subprocess.run([*cli, str(path)], capture_output=True, text=True)
    done.set()
    print("run rc", run.returncode, f"{time.perf_counter() - start:.0f} s")
    print(run.stdout[-2500:], run.stderr[-1500:])
    print("GPU processes seen during the run (gpu, pid, memory, command):")
    for (gpu, pid), what in sorted(seen.items()):
        print(f"  GPU {gpu} pid {pid}: {what}")
    runs = sorted((work / "outputs" / "layout").glob("grpo-*"))
    if runs:
        log = runs[-1] / "servers" / "judge_server.log"
        text = log.read_text() if log.exists() else ""
        print("judge requests:", text.count("POST /v1/chat/completions"), "log head:", text[:300])
        for line in (runs[-1] / "metrics.jsonl").read_text().splitlines():
            m = json.loads(line)
            if "judge/failures" in m:
                print(
                    f"  step {m['step']}: judge failures {m['judge/failures']}, rewards/judge/mean "
                    f"{m.get('rewards/judge/mean')}, rollout/tokens_per_s {m.get('rollout/tokens_per_s')}"
                )
    left = [p for p in gpu_processes()]
    print("GPU processes after the run:", left or "none")


if __name__ == "__main__":
    main()
