"""Multi-GPU scaling through the real CLI (Ray Train, DDP over NCCL), on a machine with 2+ GPUs.

python bench/scaling.py [--steps 40] [--out FILE] [--parts ...]

Parts (issue #31 added the last four):

- LFM2-1.2B architecture, random weights, saved as a local folder; synthetic chat rows (200-2048 tokens),
  as in bench/sft_throughput.py.
- Throughput: `leap-finetune run` on 1 GPU (in-process) and on 2 GPUs (2 Ray Train workers), both with
  the default SFT settings and 8 rows per GPU; real (non-padding) tokens/s from rank 0's metrics.jsonl
  after warm-up (the Trainer gathers the token count over workers), and the ratio 2 GPUs / 1 GPU.
- The data-parallel invariant: 1 GPU x 8 rows and 2 GPUs x 4 rows, first losses side by side.
- FSDP (full_shard over the decoder layers) on 2 GPUs, and each run's peak GPU memory per GPU
  (nvidia-smi, sampled every 200 ms).
- counts: the default on 1, 2, 4 and 8 GPUs (those the machine has), each with its scaling efficiency against the
  1-GPU run of the same script run (goal >= 1.9x on 2, >= 0.9 efficiency on 4 and 8).
- bf16_grads: `gradient_communication: bf16` on 2 GPUs against the float32 all-reduce, the same steps.
- buckets: ddp_bucket_cap_mb 25 / 100 / 200 / 400 on 2 GPUs.
- curve: 200 steps (--curve-steps) on 2 GPUs, float32 and bf16 all-reduce, logging every step: the loss curves as
  20-step means side by side and their largest difference (the bf16 lever becomes a default only inside the
  noise band, which the same comparison between two float32 runs with another data_seed gives).
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
import torch  # noqa: E402
import yaml  # noqa: E402
from sft_throughput import build_model, flops_per_token, make_data, matmul_peak, tokens_per_second  # noqa: E402

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class MemoryWatch:
    """The most GPU memory each device used while a run lasted (nvidia-smi, every 200 ms)."""

    def __init__(self):
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        while not self._stop.is_set():
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
            ).stdout
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


def cli_run(
    name: str,
    work: Path,
    model: Path,
    data: Path,
    gpus: str,
    steps: int,
    training: dict,
    ray: dict | None = None,
    profile: Path | None = None,
    peft: dict | None = None,
) -> dict:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "project_name": name,
        "model_name": str(model),
        "training_type": "sft",
        "dataset": {"path": str(data)},
        "training_config": {
            "extends": "DEFAULT_SFT",
            "max_steps": steps,
            "per_device_train_batch_size": 8,
            "logging_steps": 5,
            "save_strategy": "no",
            "max_length": 2048,
            "learning_rate": 1e-5,
            "warmup_steps": 0,
            **training,
        },
    }
    if ray:
        config["ray"] = ray
    if peft:
        config["peft_config"] = peft
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, **NO_MULTICAST, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONUNBUFFERED": "1"}
    if profile is not None:  # step times and a torch.profiler summary per worker (recipes/profiling.py)
        env["LEAP_FINETUNE_PROFILE"] = str(profile / name)
    start = time.perf_counter()
    with MemoryWatch() as memory:
        proc = subprocess.run(
            [sys.executable, "-m", "leap_finetune.cli", "run", str(path)], env=env, capture_output=True, text=True
        )
    wall = time.perf_counter() - start
    (folder / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200], "wall_s": wall}
    [run_dir] = list((folder / "outputs" / name).iterdir())
    metrics = run_dir / "metrics.jsonl"
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines() if '"loss"' in line]
    return {
        "tokens_per_second": tokens_per_second(metrics, warmup_steps=10),
        "wall_s": wall,
        "losses": losses,
        "model_dir": run_dir / "model",
        "peak_gib": {i: round(v / 1024, 1) for i, v in sorted(memory.peak.items())},
    }


def saved_model_line(label: str, result: dict, initial: Path, data: Path) -> str:
    """The saved model holds the trained weights: its loss on 8 training rows next to the initial model's."""
    if "error" in result:
        return f"{label}: failed ({result['error']})"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(result["model_dir"])
    rows = [json.loads(line)["messages"] for line in data.read_text().splitlines()[:8]]

    def loss(folder: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to("cuda").eval()
        total = 0.0
        with torch.no_grad():
            for messages in rows:
                ids = tokenizer.apply_chat_template(messages, return_tensors="pt", return_dict=True)["input_ids"]
                total += model(input_ids=ids.to("cuda"), labels=ids.to("cuda")).loss.item()
        del model
        torch.cuda.empty_cache()
        return total / len(rows)

    try:
        return (
            f"{label}: the saved model ({result['model_dir'].name}/, loaded with from_pretrained) has loss "
            f"{loss(result['model_dir']):.3f} on 8 training rows, the initial model {loss(initial):.3f}."
        )
    except Exception as err:  # noqa: BLE001 - reported in the table instead of ending the benchmark
        return f"{label}: loading the saved model failed: {type(err).__name__}: {str(err)[:200]}"


def curve_lines(curves: dict[str, dict], window: int = 20) -> list[str]:
    """Loss curves as `window`-step means, one column per run, and each run's largest difference from the first."""
    means = {
        name: [
            sum(r["losses"][i : i + window]) / len(r["losses"][i : i + window])
            for i in range(0, len(r["losses"]), window)
        ]
        for name, r in curves.items()
        if "error" not in r
    }
    if not means:
        return ["", "Loss curves: every run failed: " + "; ".join(r["error"] for r in curves.values())]
    names = list(means)
    lines = ["", f"Loss curves, {window}-step means (2 workers):", "", "| steps | " + " | ".join(names) + " |"]
    lines.append("| --- |" + " --- |" * len(names))
    for i in range(max(len(v) for v in means.values())):
        cells = [f"{means[n][i]:.4f}" if i < len(means[n]) else "" for n in names]
        lines.append(f"| {i * window + 1}-{(i + 1) * window} | " + " | ".join(cells) + " |")
    first = names[0]
    for name in names[1:]:
        diff = max(abs(a - b) for a, b in zip(means[first], means[name]))
        lines.append(f"\nLargest difference of {window}-step means, {name} vs {first}: {diff:.4f}")
    return lines


def ratio_row(one: dict, two: dict) -> str:
    if "error" in one or "error" in two:
        return "| 2 GPUs / 1 GPU | | | - | | | | |"
    ratio = two["tokens_per_second"] / one["tokens_per_second"]
    return f"| 2 GPUs / 1 GPU | | | {ratio:.2f}x (scaling efficiency {100 * ratio / 2:.0f}%) | | | | |"


def balance_line(lengths: list[int], per_device: int, workers: int) -> str:
    """The best scaling each sampler allows on these rows: a step lasts as long as its busiest worker, so
    the bound is mean tokens per worker / max tokens per worker, over an epoch (the samplers replayed)."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    from leap_finetune.recipes.sampling import _token_balanced_class

    def efficiency(batches_per_rank):
        mean = peak = 0
        for step in zip(*batches_per_rank):
            tokens = [sum(lengths[i] for i in batch) for batch in step]
            mean += sum(tokens) / workers
            peak += max(tokens)
        return mean / peak

    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(lengths), generator=g).tolist()
    random_dealing = [
        [
            order[s + r * per_device : s + (r + 1) * per_device]
            for s in range(0, len(order) - per_device * workers + 1, per_device * workers)
        ]
        for r in range(workers)
    ]
    found = {"random": efficiency(random_dealing)}
    for name, cls in (
        ("transformers' batch_rebalance (padded cost)", BatchRebalanceSampler),
        ("leap-finetune's token-balanced", _token_balanced_class()),
    ):
        found[name] = efficiency([list(cls(lengths, per_device * workers, workers, 1, rank=r)) for r in range(workers)])
    return (
        "Work balance across workers (mean / busiest worker's tokens per step, the samplers replayed on these rows, "
        f"{workers} x {per_device} rows): " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in found.items()) + "."
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--work", default="/tmp/leap-scale")
    parser.add_argument("--out", default=None)
    parser.add_argument("--parts", default="throughput,random,invariant,bucket,batch16,fsdp,fsdp_lora")
    parser.add_argument("--curve-steps", type=int, default=200)
    parser.add_argument("--profiles", default=None, help="folder for the workers' profiles (LEAP_FINETUNE_PROFILE)")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    peak = matmul_peak()
    model = work / "lfm2-1.2b"
    n_params, arch = build_model("1.2b", model)
    data = work / "chat.jsonl"
    parts = args.parts.split(",")
    rows = max(args.steps, args.curve_steps if "curve" in parts else 0) * 8 * torch.cuda.device_count() + 64
    lengths = make_data(data, rows=rows)
    per_token = flops_per_token(n_params, arch, lengths)
    import transformers

    lines = [
        f"### {datetime.date.today()} - {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} - torch "
        f"{torch.__version__}, transformers {transformers.__version__}",
        "",
        f"Command: `python {' '.join(sys.argv)}`. bf16 matmul peak measured in this run (one GPU): "
        f"{peak / 1e12:.0f} TFLOP/s. LFM2-1.2B ({n_params / 1e6:.0f}M), {len(lengths)} synthetic rows of "
        f"{min(lengths)}-{max(lengths)} tokens, max_length 2048, default SFT settings.",
        "",
        "| run | GPUs | rows per GPU | real tokens/s | MFU per GPU | peak GiB per GPU | wall s | first losses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def row(label: str, gpus: int, batch: int, r: dict) -> str:
        if "error" in r:
            return f"| {label} | {gpus} | {batch} | failed: {r['error']} | | | {r['wall_s']:.0f} | |"
        mfu = r["tokens_per_second"] * per_token / (peak * gpus)
        return (
            f"| {label} | {gpus} | {batch} | {r['tokens_per_second']:,.0f} | {100 * mfu:.1f}% | "
            f"{', '.join(str(v) for v in r['peak_gib'].values())} | {r['wall_s']:.0f} | "
            f"{', '.join(f'{x:.4f}' for x in r['losses'][:3])} |"
        )

    def flush():
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        if args.out:
            Path(args.out).write_text(text)

    profiles = Path(args.profiles) if args.profiles else None
    lines[-2:-2] = [balance_line(lengths, per_device=8, workers=2), ""]
    one = None
    if "throughput" in parts:
        one = cli_run("one-gpu", work, model, data, "0", args.steps, {}, profile=profiles)
        lines.append(row("default, in-process", 1, 8, one))
        flush()
        two = cli_run("two-gpus", work, model, data, "0,1", args.steps, {}, profile=profiles)
        lines.append(row("default (batch_rebalance), 2 Ray Train workers (DDP)", 2, 8, two))
        lines.append(ratio_row(one, two))
        flush()
    if "random" in parts:
        two = cli_run(
            "two-gpus-random",
            work,
            model,
            data,
            "0,1",
            args.steps,
            {"train_sampling_strategy": "random"},
            profile=profiles,
        )
        lines.append(row("train_sampling_strategy: random, 2 workers", 2, 8, two))
        if one is not None:
            lines.append(ratio_row(one, two))
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
    if "bucket" in parts:
        big = cli_run("two-gpus-bucket", work, model, data, "0,1", args.steps, {"ddp_bucket_cap_mb": 200})
        lines.append(row("ddp_bucket_cap_mb: 200, 2 workers", 2, 8, big))
        flush()
    if "batch16" in parts:
        b16 = cli_run("two-gpus-b16", work, model, data, "0,1", args.steps, {"per_device_train_batch_size": 16})
        lines.append(row("16 rows per GPU, 2 workers", 2, 16, b16))
        flush()
    visible = torch.cuda.device_count()
    if "counts" in parts:
        base = one or cli_run("one-gpu", work, model, data, "0", args.steps, {}, profile=profiles)
        if one is None:
            lines.append(row("default, in-process", 1, 8, base))
        for count in (n for n in (2, 4, 8) if n <= visible):
            devices = ",".join(map(str, range(count)))
            run = cli_run(f"gpus-{count}", work, model, data, devices, args.steps, {}, profile=profiles)
            lines.append(row(f"default, {count} Ray Train workers (DDP)", count, 8, run))
            if "error" not in base and "error" not in run:
                ratio = run["tokens_per_second"] / base["tokens_per_second"]
                lines.append(
                    f"| {count} GPUs / 1 GPU | | | {ratio:.2f}x (efficiency {100 * ratio / count:.0f}%) | | | | |"
                )
            flush()
    if "bf16_grads" in parts and visible >= 2:
        fp32 = cli_run("grads-fp32", work, model, data, "0,1", args.steps, {})
        bf16 = cli_run("grads-bf16", work, model, data, "0,1", args.steps, {"gradient_communication": "bf16"})
        lines.append(row("gradient all-reduce fp32 (default), 2 workers", 2, 8, fp32))
        lines.append(row("gradient_communication: bf16, 2 workers", 2, 8, bf16))
        if "error" not in fp32 and "error" not in bf16:
            lines.append(
                f"| bf16 / fp32 all-reduce | | | {bf16['tokens_per_second'] / fp32['tokens_per_second']:.3f}x | | | | |"
            )
        flush()
    if "buckets" in parts and visible >= 2:
        for cap in (25, 100, 200, 400):
            run = cli_run(f"bucket-{cap}", work, model, data, "0,1", args.steps, {"ddp_bucket_cap_mb": cap})
            lines.append(row(f"ddp_bucket_cap_mb: {cap}, 2 workers", 2, 8, run))
            flush()
    if "curve" in parts and visible >= 2:
        every = {"logging_steps": 1}
        curves = {
            "fp32": cli_run("curve-fp32", work, model, data, "0,1", args.curve_steps, every),
            "fp32, data_seed 1 (noise band)": cli_run(
                "curve-fp32-seed", work, model, data, "0,1", args.curve_steps, {**every, "data_seed": 1}
            ),
            "bf16": cli_run(
                "curve-bf16", work, model, data, "0,1", args.curve_steps, {**every, "gradient_communication": "bf16"}
            ),
        }
        lines.extend(curve_lines(curves))
        flush()
    notes = []
    fsdp_keys = {
        "fsdp": "full_shard auto_wrap",
        "compile_layers": False,
        "fsdp_config": {"transformer_layer_cls_to_wrap": ["Lfm2DecoderLayer"]},
    }
    if "fsdp" in parts:
        fsdp = cli_run("fsdp", work, model, data, "0,1", args.steps, fsdp_keys)
        lines.append(row("FSDP full_shard (2 workers), layers not compiled", 2, 8, fsdp))
        notes.append(saved_model_line("FSDP full fine-tune", fsdp, model, data))
        flush()
    if "fsdp_lora" in parts:
        lora = cli_run(
            "fsdp-lora",
            work,
            model,
            data,
            "0,1",
            args.steps,
            {**fsdp_keys, "learning_rate": 1e-3},
            peft={"extends": "DEFAULT_LORA"},
        )
        lines.append(row("FSDP full_shard + LoRA (2 workers)", 2, 8, lora))
        notes.append(saved_model_line("FSDP + LoRA (adapter merged)", lora, model, data))
        flush()
    if notes:
        lines.extend([""] + notes)
        flush()


if __name__ == "__main__":
    main()
