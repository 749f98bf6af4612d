"""Issue #48: every documented resume path through the real command line, with its exit code and message - for the
GPU machine, where a resume of an LFM2-1.2B run once exited 2 (its message not kept) while the CPU's did not.

    python bench/resume_paths.py --model 1.2b --steps 24        # on the GPU (random weights of LFM2-1.2B)
    python bench/resume_paths.py --model tiny --steps 12        # here: the same paths on the tiny model, CPU

The paths (docs/outputs.md): SIGTERM to the run's process group after a checkpoint, then `latest`; SIGKILL of the
training process as a checkpoint is saved (the fault point), then `latest`; `latest` of a finished run ("already
finished", exit 0); `latest` with max_steps raised; `latest` with a changed learning rate, refused (exit 2) and
then allowed by resume_allow_changes; `resume_from_checkpoint: true`; the run folder as the checkpoint. Each row:
the command, the expected and actual exit code, the last lines it printed. A table last, and --out JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")


def write_config(work: Path, model: str, project: str, steps: int, **training) -> Path:
    import yaml

    config = {
        "project_name": project,
        "model_name": model,
        "training_type": "sft",
        "dataset": {"path": str(work / "sft.jsonl"), "test_size": 8},
        "training_config": {
            "max_steps": steps,
            "save_steps": max(2, steps // 4),
            # (two checkpoints kept: a 1.2B full fine-tune's is ~14 GiB with its optimizer state, and the lent GPU
            # machine's 64 GiB disk filled with every path's four - measured 2026-12-05)
            "save_total_limit": 2,
            "eval_steps": max(2, steps // 2),
            "logging_steps": 1,
            "max_length": 512,
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-4,
            **training,
        },
    }
    path = work / f"{project}-{len(list(work.glob('*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def cli(*args: str, env: dict | None = None, sigterm_after: Path | None = None, timeout: float = 1800) -> dict:
    """One command: its exit code, seconds and last lines; `sigterm_after`: SIGTERM to its process group once a
    checkpoint of that run folder's parent is marked complete."""
    command = [sys.executable, "-m", "leap_finetune.cli", *args]
    full_env = {**os.environ, "COLUMNS": "160", **(env or {})}
    start = time.monotonic()
    proc = subprocess.Popen(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    if sigterm_after is not None:
        while proc.poll() is None and not list(sigterm_after.glob("*/checkpoint-*/leap_checkpoint_complete.json")):
            time.sleep(0.5)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    return {"code": proc.returncode, "seconds": round(time.monotonic() - start, 1), "said": lines[-3:]}


def paths(work: Path, model: str, steps: int, groups: set[str]) -> list[dict]:
    rows = []

    def row(name: str, expected: int, result: dict, words: str = "") -> None:
        said = " ".join(result["said"])
        ok = result["code"] == expected and words in said
        rows.append({"path": name, "expected": expected, **result, "ok": ok})
        print(json.dumps(rows[-1]), flush=True)

    if "full" in groups:
        finished_paths(work, model, steps, row)
    if "term" in groups:
        term = write_config(work, model, "term", steps)
        row("SIGTERM to the process group after a checkpoint", 128 + signal.SIGTERM,
            cli("run", str(term), sigterm_after=work / "outputs" / "term"), "checkpoint")  # fmt: skip
        row("latest after SIGTERM", 0, cli("run", str(term), "--set", "training_config.resume_from_checkpoint=latest"))
        free_disk(work, "term")
    if "kill" in groups:
        killed_paths(work, model, steps, row, rows)
    if "again" in groups:
        again_paths(work, model, steps, row)
    return rows


def free_disk(work: Path, project: str) -> None:
    """A path's run folder goes once its rows are written: the lent machine's 64 GiB disk holds only a few 1.2B
    checkpoints with their optimizer state (2026-12-06: the third path's checkpoint met a full disk)."""
    import shutil

    shutil.rmtree(work / "outputs" / project, ignore_errors=True)


def finished_paths(work: Path, model: str, steps: int, row) -> None:
    full = write_config(work, model, "full", steps)
    row("a run to the end", 0, cli("run", str(full)))
    row("latest of a finished run", 0, cli("run", str(full), "--set", "training_config.resume_from_checkpoint=latest"),
        "already finished")  # fmt: skip
    row("latest with max_steps raised", 0, cli("run", str(full), "--set", "training_config.resume_from_checkpoint=latest",
        "--set", f"training_config.max_steps={steps + max(2, steps // 4)}"))  # fmt: skip
    free_disk(work, "full")


def killed_paths(work: Path, model: str, steps: int, row, rows: list) -> None:
    kill = write_config(work, model, "kill", steps)
    killed = cli("run", str(kill), env={"LEAP_FINETUNE_FAULT": "checkpoint-saved#2=SIGKILL"})
    rows.append({"path": "SIGKILL of the training process at its 2nd checkpoint", "expected": "not 0", **killed,
                 "ok": killed["code"] != 0})  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    changed = ("--set", "training_config.resume_from_checkpoint=latest", "--set", "training_config.learning_rate=5e-5")
    row("latest with a changed learning rate (refused)", 2, cli("run", str(kill), *changed), "learning_rate")
    row("... allowed by resume_allow_changes", 0,
        cli("run", str(kill), *changed, "--set", "training_config.resume_allow_changes=[learning_rate]"))  # fmt: skip
    free_disk(work, "kill")


def again_paths(work: Path, model: str, steps: int, row) -> None:
    again = write_config(work, model, "again", steps)
    cli("run", str(again), env={"LEAP_FINETUNE_FAULT": "checkpoint-saved#2=SIGKILL"})
    row(
        "resume_from_checkpoint: true",
        0,
        cli("run", str(again), "--set", "training_config.resume_from_checkpoint=true"),
    )
    run_dir = next((work / "outputs" / "again").iterdir())
    row("the run folder as the checkpoint", 0,
        cli("run", str(again), "--set", f"training_config.resume_from_checkpoint={run_dir}"), "already finished")  # fmt: skip
    free_disk(work, "again")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny", help="tiny (CPU), or a bench/memory.py key: 350m, 1.2b, 2.6b")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--work", default="/tmp/leap-resume-paths")
    parser.add_argument("--out", default="")
    parser.add_argument("--groups", default="full,term,kill,again", help="which paths: full,term,kill,again")
    args = parser.parse_args()
    work = Path(args.work)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sys.path.insert(0, str(ROOT / "bench"))
    import memory

    memory.write_rows(work / "sft.jsonl", "sft", rows=96)
    model = "tiny-lfm2" if args.model == "tiny" else str(memory.build_model(args.model, work / "models" / args.model))
    rows = paths(work, model, args.steps, set(args.groups.split(",")))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    print("\n| path | expected | exit | s | ok | last line |\n| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['path']} | {r['expected']} | {r['code']} | {r['seconds']} | {r['ok']} | {(r['said'] or [''])[-1][:90]} |"
        )


if __name__ == "__main__":
    main()
