"""Embedding training on 2 GPUs (Ray Train, NCCL) against 1 GPU with the same global batch: the data-parallel
invariant on the real path (one no-duplicates batch split among the workers, documents gathered with
gradients, DDP), and the throughput of each.

python bench/retrieval_workers.py [--steps 20] [--batch 128] [--out FILE]

LFM2-350M architecture (random weights), last-token pooling, MNRL, bf16; 1 worker x batch vs 2 workers x
batch/2. Losses are compared step by step (bf16: a few 1e-3 apart at most is expected); pairs/s from the
Trainer's train_samples_per_second (whole run, first steps included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def run(model_dir: Path, data: Path, work: Path, steps: int, batch: int, workers: int) -> dict:
    from leap_finetune.api import run_config

    config = {
        "project_name": f"workers-{workers}",
        "model_name": str(model_dir),
        "training_type": "embedding",
        "dataset": {"path": str(data), "limit": batch * steps + 100},
        "retrieval": {"query_max_length": 32, "document_max_length": 256},
        "ray": {"num_workers": workers},
        "training_config": {
            "max_steps": steps,
            "per_device_train_batch_size": batch // workers,
            "logging_steps": 1,
            "save_strategy": "no",
            "learning_rate": 1e-5,
            "warmup_steps": 0,
            "lr_scheduler_type": "constant",
        },
    }
    summary = run_config(config, outputs_root=work / "outputs")
    records = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    speed = next((r["train_samples_per_second"] for r in records if "train_samples_per_second" in r), float("nan"))
    return {"losses": losses, "pairs_per_s": speed}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--work", default="/tmp/leap-retrieval-workers")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import torch
    import transformers
    from retrieval_throughput import make_rows
    from sft_throughput import build_model

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = work / "lfm2-350m"
    build_model("350m", model_dir)
    data = work / "pairs.jsonl"
    make_rows(data, args.batch * args.steps + 100)
    one = run(model_dir, data, work, args.steps, args.batch, 1)
    two = run(model_dir, data, work, args.steps, args.batch, 2)
    diffs = [
        abs(two["losses"][s] - one["losses"][s]) / max(abs(one["losses"][s]), 1e-9)
        for s in one["losses"]
        if s in two["losses"]
    ]
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    lines = [
        f"### {datetime.date.today()} - embedding on 2 GPUs vs 1 - {torch.cuda.device_count()} x {device} - "
        f"torch {torch.__version__}, transformers {transformers.__version__}",
        "",
        f"Command: `python {' '.join(sys.argv)}` (NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')})",
        "",
        f"LFM2-350M architecture, MNRL, global batch {args.batch}, {args.steps} steps, constant lr 1e-5.",
        "",
        "| run | pairs/s (whole run) | loss step 1 | loss last step |",
        "| --- | --- | --- | --- |",
    ]
    last = max(one["losses"])
    for label, result in ((f"1 GPU x {args.batch}", one), (f"2 GPUs x {args.batch // 2} (Ray Train)", two)):
        lines.append(
            f"| {label} | {result['pairs_per_s']:,.0f} | {result['losses'].get(1, float('nan')):.4f} | "
            f"{result['losses'].get(last, float('nan')):.4f} |"
        )
    lines += [
        "",
        f"Steps compared: {len(diffs)}; largest relative loss difference: {max(diffs):.2e}; mean: "
        f"{sum(diffs) / len(diffs):.2e}.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
