"""Evaluation beside training vs evaluation that pauses it, on a machine with 2 GPUs.

python bench/async_eval.py [--steps 200] [--every 50] [--rows 200] [--new-tokens 64] [--out FILE]

LFM2-350M architecture (random weights, bf16 as LiquidAI ships it; no download), SFT on synthetic chat rows,
a generation benchmark of `--rows` rows every `--every` steps (and before / after training, as always):
- sync:     1 training GPU (CUDA_VISIBLE_DEVICES=0); training pauses while the benchmark generates.
- reserved: 2 GPUs visible, `async_eval: {mode: reserved, vllm_gpus: 1}`: the driver keeps GPU 0 for the
            evaluation server (vLLM where installed, else leap-finetune's own), training runs on GPU 1; a server
            per evaluation (`weight_reload: respawn`, the spec's default).
- in_place: the same with `weight_reload: in_place` (one server, each snapshot's weights loaded into it).
- none:     1 GPU, no benchmarks: the training time the goal compares with (evaluation costs <= 5% of it).
Issue #31's goal on 2 GPUs: in_place's total wall time <= sync's, its training time <= none's + 5%:
`python bench/async_eval.py --modes none,sync,reserved,in_place`.
Each run is the user's command (`python -m leap_finetune.cli CONFIG`) in its own process. Reported: training
tokens/s (median of the logged windows, metrics.jsonl) and MFU against a bf16 matmul peak measured here, the
training time (summary.json train_runtime_s), the command's total wall time, and which steps were evaluated.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from leap_finetune.runs.processes import NO_MULTICAST  # noqa: E402 - the project's own (NVLink multicast off)


def write_benchmark(path: Path, rows: int) -> None:
    colors = ["red", "blue", "green", "gold", "pink", "gray", "teal", "navy"]
    lines = [
        json.dumps(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": f"Question {i}: which color comes after "
                        f"{colors[i % 8]} in the list {', '.join(colors)}? Explain briefly.",
                    },
                    {"role": "assistant", "content": colors[(i + 1) % 8]},
                ]
            }
        )
        for i in range(rows)
    ]
    path.write_text("\n".join(lines) + "\n")


def run(label: str, config: dict, work: Path, devices: str, timeout_s: int) -> dict:
    import yaml

    folder = work / label
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, **NO_MULTICAST, "CUDA_VISIBLE_DEVICES": devices}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "leap_finetune.cli", str(path)],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-6000:], sep="\n")
        raise SystemExit(f"{label}: exit code {done.returncode}")
    [run_dir] = list((folder / "outputs").glob("*/*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    speeds = [r["tokens_per_second"] for r in records if "tokens_per_second" in r and r["step"] > 10]
    evaluated = sorted(r["step"] for r in records if any(k.endswith("/score") for k in r))
    lines = [line for line in done.stderr.splitlines() if "skipped" in line or "failed" in line or "arrived" in line]
    return {
        "wall_s": wall,
        "train_s": summary["train_runtime_s"],
        "tokens_per_second": statistics.median(speeds),
        "tokens_seen": summary["tokens_seen"],
        "evaluated_steps": evaluated,
        "final_score": summary.get("benchmarks"),
        "notes": lines[:12],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--timeout", type=int, default=420)
    parser.add_argument("--modes", default="sync,reserved")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import torch
    from sft_throughput import build_model, flops_per_token, make_data, matmul_peak

    work = Path("/tmp/bench-async-eval")
    work.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak()
    n_params, arch = build_model("350m", work / "model")
    lengths = make_data(work / "train.jsonl", rows=args.steps * 8 + 64)
    write_benchmark(work / "bench.jsonl", args.rows)
    per_token = flops_per_token(n_params, arch, lengths)
    base = {
        "project_name": "async-bench",
        "model_name": str(work / "model"),
        "training_type": "sft",
        "dataset": {"path": str(work / "train.jsonl")},
        "training_config": {
            "max_steps": args.steps,
            "per_device_train_batch_size": 8,
            "max_length": 2048,
            "learning_rate": 1e-5,
            "logging_steps": 5,
            "save_strategy": "no",
        },
        "evals": {
            "max_new_tokens": args.new_tokens,
            "batch_size": 32,
            "eval_steps": args.every,
            "benchmarks": [{"name": "colors", "path": str(work / "bench.jsonl"), "metric": "short_answer"}],
        },
    }
    results = {}
    for mode in args.modes.split(","):
        if mode == "sync":
            results[mode] = run("sync", base, work, "0", args.timeout)
        elif mode == "none":
            results[mode] = run("none", {k: v for k, v in base.items() if k != "evals"}, work, "0", args.timeout)
        else:
            config = {
                **base,
                "async_eval": {
                    "mode": "reserved" if mode == "in_place" else mode,
                    "vllm_gpus": 1,
                    "on_overlap": "queue",
                    "reserved": {
                        "server_port": 8100,
                        "weight_reload": "in_place" if mode == "in_place" else "respawn",
                    },
                    "wait_at_end_s": args.timeout,
                },
            }
            results[mode] = run(mode, config, work, "0,1", args.timeout)
        print(mode, json.dumps(results[mode]), flush=True)
    record = {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "matmul_peak_tflops": peak / 1e12,
        "args": vars(args),
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2))
    print(
        f"\nLFM2-350M SFT, {args.steps} steps x 8 rows, generation benchmark {args.rows} rows x {args.new_tokens} "
        f"new tokens every {args.every} steps; bf16 matmul peak {peak / 1e12:.0f} TFLOP/s"
    )
    print("| mode | GPUs | training tokens/s | MFU | training time | total wall time | evaluated steps |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mode, r in results.items():
        mfu = r["tokens_per_second"] * per_token / peak
        gpus = "1 (training)" if mode in ("sync", "none") else "1 training + 1 eval"
        print(
            f"| {mode} | {gpus} | {r['tokens_per_second']:,.0f} | {mfu:.1%} | {r['train_s']:.1f} s | "
            f"{r['wall_s']:.1f} s | {r['evaluated_steps']} |"
        )


if __name__ == "__main__":
    main()
