"""Where the time of a leap-finetune SFT step goes on a CUDA machine (the gap to the matmul peak).

python bench/profile_step.py [--model 1.2b] [--variant default] [--shapes] [--out FILE]

Trains through the real path (bench/sft_throughput.py's model, data and variants), profiles steps
21-25 with torch.profiler and groups the GPU kernel time: matmuls, attention, compiled (Triton)
kernels, the fused LM-head loss, optimizer, other. Prints the groups and the top kernels.
--shapes also records the CPU side: for every GEMM that is not one of cuBLAS's Hopper kernels (nvjet),
the operator that launched it with its input shapes and strides (which operand is misaligned), and
the host synchronisations per step (`.item()` and friends keep the GPU idle).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import torch
from transformers import TrainerCallback

from bench.sft_throughput import VARIANTS, build_model, make_data

GROUPS = [
    ("matmul (cuBLAS/CUTLASS)", re.compile(r"gemm|nvjet|cutlass|sm90_xmma|cublas|splitK", re.I)),
    ("attention (flash varlen)", re.compile(r"flash|fmha|attention", re.I)),
    ("LM-head loss (TRL chunked)", re.compile(r"_forward_kernel|_backward_kernel|logprob|_tile", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|_amp_", re.I)),
    ("compiled (Triton, fused)", re.compile(r"^triton_|triton", re.I)),
    ("copies / casts", re.compile(r"copy|cast|Memcpy|Memset|to_copy|fill", re.I)),
]


class Profile(TrainerCallback):
    def __init__(self, start: int, steps: int, shapes: bool = False):
        self.start, self.steps, self.profiler, self.wall, self.shapes = start, steps, None, 0.0, shapes

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.start:
            torch.cuda.synchronize()
            activities = [torch.profiler.ProfilerActivity.CUDA]
            if self.shapes:
                activities.append(torch.profiler.ProfilerActivity.CPU)
            self.profiler = torch.profiler.profile(activities=activities, record_shapes=self.shapes)
            self.profiler.__enter__()
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is not None and state.global_step == self.start + self.steps:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            torch.cuda.synchronize()
            self.wall = self.event.elapsed_time(end) / 1e3
            self.profiler.__exit__(None, None, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="1.2b")
    parser.add_argument("--variant", default="default")
    parser.add_argument("--work", default="/tmp/leap-profile")
    parser.add_argument("--out", default=None)
    parser.add_argument("--shapes", action="store_true", help="name the operands of the non-Hopper GEMMs")
    args = parser.parse_args()
    from leap_finetune.api import run_config

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "chat.jsonl"
    make_data(data, rows=30 * 8)
    model_dir = work / f"lfm2-{args.model}"
    build_model(args.model, model_dir)
    profile = Profile(start=20, steps=5, shapes=args.shapes)
    label, overrides = VARIANTS[args.variant]
    config = {
        "project_name": "profile",
        "model_name": str(model_dir),
        "training_type": "sft",
        "dataset": {"path": str(data)},
        "training_config": {
            "extends": "DEFAULT_SFT",
            "max_steps": 26,
            "per_device_train_batch_size": 8,
            "logging_steps": 5,
            "save_strategy": "no",
            "max_length": 2048,
            "learning_rate": 1e-5,
            **overrides,
        },
    }
    run_config(config, outputs_root=work / "outputs", callbacks=[profile])
    # GPU kernels only: with --shapes the CPU operators are recorded too, and each one's device time repeats its
    # kernels' (the first --shapes run, 2026-12-02, summed to 441% of wall time that way)
    events = [
        e
        for e in profile.profiler.key_averages()
        if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA
    ]
    total = sum(e.device_time_total for e in events) / 1e6
    groups: dict[str, float] = defaultdict(float)
    for event in events:
        name = next((g for g, pattern in GROUPS if pattern.search(event.key)), "other (elementwise, norms, conv)")
        groups[name] += event.device_time_total / 1e6
    lines = [
        f"Profile: LFM2-{args.model}, {label}, steps 21-25: wall {profile.wall:.3f} s, GPU kernel time {total:.3f} s "
        f"({100 * total / max(profile.wall, 1e-9):.0f}% of wall)",
        "",
        "| kernel group | GPU s | share of kernel time |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {g} | {t:.3f} | {100 * t / total:.1f}% |" for g, t in sorted(groups.items(), key=lambda x: -x[1])]
    lines += ["", "| top kernels | GPU s | calls |", "| --- | --- | --- |"]
    for event in sorted(events, key=lambda e: -e.device_time_total)[:15]:
        lines.append(f"| `{event.key[:90]}` | {event.device_time_total / 1e6:.3f} | {event.count} |")
    if args.shapes:
        lines += shape_lines(profile.profiler, work / "trace.json", steps=5)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


def shape_lines(profiler, trace: Path, steps: int) -> list[str]:
    """The launching operator of every GEMM kernel that is not cuBLAS's Hopper nvjet kernel, read from the
    chrome trace (a kernel's "External id" is its innermost CPU operator's), and the host syncs per step."""
    import json

    profiler.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    ops = {
        e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})
    }
    found: dict[tuple, list] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") != "kernel" or not re.search(r"cutlass|gemm|splitK", e["name"], re.I) or "nvjet" in e["name"]:
            continue
        op = ops.get(e.get("args", {}).get("External id"), {})
        a = op.get("args", {})
        key = (e["name"][:70], op.get("name", "?"), str(a.get("Input Dims")), str(a.get("Input Strides")))
        found[key][0] += 1
        found[key][1] += e.get("dur", 0) / 1e6
    lines = [
        "",
        "| non-Hopper GEMM kernel | operator | input dims | input strides | calls | GPU s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (kernel, op, dims, strides), (n, t) in sorted(found.items(), key=lambda x: -x[1][1])[:20]:
        lines.append(f"| `{kernel}` | {op} | {dims} | {strides} | {n} | {t:.4f} |")
    syncs = defaultdict(int)
    for e in events:
        if e.get("cat") in ("cpu_op", "cuda_runtime") and re.search(
            r"_local_scalar_dense|aten::item|cudaStreamSynchronize|cudaDeviceSynchronize|cudaMemcpy(?!Async)", e["name"]
        ):
            syncs[e["name"]] += 1
    lines += ["", "| host synchronisation | per step |", "| --- | --- |"]
    lines += [f"| {name} | {n / steps:.1f} |" for name, n in sorted(syncs.items(), key=lambda x: -x[1])]
    return lines


if __name__ == "__main__":
    main()
