"""Multi-GPU scaling through the real CLI (Ray Train, DDP over NCCL), on a machine with 2+ GPUs.

python bench/scaling.py [--steps 40] [--out FILE]

- LFM2-1.2B architecture, random weights, saved as a local folder; synthetic chat rows (200-2048 tokens),
  as in bench/sft_throughput.py.
- Throughput: `leap-finetune run` on 1 GPU (in-process) and on 2 GPUs (2 Ray Train workers), both with
  the default SFT settings and 8 rows per GPU; real (non-padding) tokens/s from rank 0's metrics.jsonl
  after warm-up (the Trainer gathers the token count over workers), and the ratio 2 GPUs / 1 GPU.
- The data-parallel invariant: 1 GPU x 8 rows and 2 GPUs x 4 rows, first losses side by side.
- FSDP (full_shard over the decoder layers) on 2 GPUs, and each run's peak GPU memory per GPU
  (nvidia-smi, sampled every 200 ms).
Every process keeps NVLink multicast off (NCCL_NVLS_ENABLE=0 and siblings: the CLI passes them on).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sft_throughput import build_model, flops_per_token, make_data, matmul_peak, tokens_per_second  # noqa: E402

import torch  # noqa: E402
import yaml  # noqa: E402

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class MemoryWatch:
    """The most GPU memory each device used while a run lasted (nvidia-smi, every 200 ms)."""

    def __init__(self):
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout
            for line in out.strip().splitlines():
                index, used = (int(x) for x in line.split(","))
                self.peak[index] = max(self.peak.get(index, 0), used)
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def cli_run(name: str, work: Path, model: Path, data: Path, gpus: str, steps: int, training: dict,
            ray: dict | None = None) -> dict:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    config = {"project_name": name, "model_name": str(model), "training_type": "sft", "dataset": {"path": str(data)},
              "training_config": {"extends": "DEFAULT_SFT", "max_steps": steps, "per_device_train_batch_size": 8,
                                  "logging_steps": 5, "save_strategy": "no", "max_length": 2048,
                                  "learning_rate": 1e-5, "warmup_steps": 0, **training}}
    if ray:
        config["ray"] = ray
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, **NO_MULTICAST, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with MemoryWatch() as memory:
        proc = subprocess.run([sys.executable, "-m", "leap_finetune.cli", "run", str(path)], env=env,
                              capture_output=True, text=True)
    wall = time.perf_counter() - start
    (folder / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200], "wall_s": wall}
    [run_dir] = list((folder / "outputs" / name).iterdir())
    metrics = run_dir / "metrics.jsonl"
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    return {"tokens_per_second": tokens_per_second(metrics, warmup_steps=10), "wall_s": wall, "losses": losses,
            "peak_gib": {i: round(v / 1024, 1) for i, v in sorted(memory.peak.items())}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--work", default="/tmp/leap-scale")
    parser.add_argument("--out", default=None)
    parser.add_argument("--parts", default="throughput,invariant,fsdp")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak()
    model = work / "lfm2-1.2b"
    n_params, arch = build_model("1.2b", model)
    data = work / "chat.jsonl"
    lengths = make_data(data, rows=args.steps * 16 + 64)
    per_token = flops_per_token(n_params, arch, lengths)
    import transformers

    lines = [f"### {datetime.date.today()} - {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} - torch "
             f"{torch.__version__}, transformers {transformers.__version__}", "",
             f"Command: `python {' '.join(sys.argv)}`. bf16 matmul peak measured in this run (one GPU): "
             f"{peak / 1e12:.0f} TFLOP/s. LFM2-1.2B ({n_params / 1e6:.0f}M), {len(lengths)} synthetic rows of "
             f"{min(lengths)}-{max(lengths)} tokens, max_length 2048, default SFT settings.", "",
             "| run | GPUs | rows per GPU | real tokens/s | MFU per GPU | peak GiB per GPU | wall s | first losses |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]

    def row(label: str, gpus: int, batch: int, r: dict) -> str:
        if "error" in r:
            return f"| {label} | {gpus} | {batch} | failed: {r['error']} | | | {r['wall_s']:.0f} | |"
        mfu = r["tokens_per_second"] * per_token / (peak * gpus)
        return (f"| {label} | {gpus} | {batch} | {r['tokens_per_second']:,.0f} | {100 * mfu:.1f}% | "
                f"{', '.join(str(v) for v in r['peak_gib'].values())} | {r['wall_s']:.0f} | "
                f"{', '.join(f'{x:.4f}' for x in r['losses'][:3])} |")

    def flush():
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        if args.out:
            Path(args.out).write_text(text)

    parts = args.parts.split(",")
    if "throughput" in parts:
        one = cli_run("one-gpu", work, model, data, "0", args.steps, {})
        lines.append(row("default, in-process", 1, 8, one))
        flush()
        two = cli_run("two-gpus", work, model, data, "0,1", args.steps, {})
        lines.append(row("default, 2 Ray Train workers (DDP)", 2, 8, two))
        if "error" not in one and "error" not in two:
            ratio = two["tokens_per_second"] / one["tokens_per_second"]
            lines.append(f"| 2 GPUs / 1 GPU | | | {ratio:.2f}x (scaling efficiency {100 * ratio / 2:.0f}%) | | | | |")
        flush()
    if "invariant" in parts:
        a = cli_run("inv-one", work, model, data, "0", 8, {"logging_steps": 1})
        b = cli_run("inv-two", work, model, data, "0,1", 8, {"logging_steps": 1, "per_device_train_batch_size": 4})
        lines.append(row("invariant: 1 GPU x 8 rows", 1, 8, a))
        lines.append(row("invariant: 2 GPUs x 4 rows", 2, 4, b))
        if "error" not in a and "error" not in b:
            diff = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
            lines.append(f"| invariant: max loss difference over 8 steps | | | {diff:.2e} | | | | |")
        flush()
    if "fsdp" in parts:
        fsdp = cli_run("fsdp", work, model, data, "0,1", args.steps,
                       {"fsdp": "full_shard auto_wrap", "compile_layers": False,
                        "fsdp_config": {"transformer_layer_cls_to_wrap": ["Lfm2DecoderLayer"]}})
        lines.append(row("FSDP full_shard (2 workers), layers not compiled", 2, 8, fsdp))
        flush()


if __name__ == "__main__":
    main()
