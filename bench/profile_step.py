"""Where the time of a leap-finetune SFT step goes on a CUDA machine (the gap to the matmul peak).

python bench/profile_step.py [--model 1.2b] [--variant default] [--out FILE]

Trains through the real path (bench/sft_throughput.py's model, data and variants), profiles steps
21-25 with torch.profiler and groups the GPU kernel time: matmuls, attention, compiled (Triton)
kernels, the fused LM-head loss, optimizer, other. Prints the groups and the top kernels.
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
    def __init__(self, start: int, steps: int):
        self.start, self.steps, self.profiler, self.wall = start, steps, None, 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.start:
            torch.cuda.synchronize()
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
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
    args = parser.parse_args()
    from leap_finetune.api import run_config

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    data = work / "chat.jsonl"
    make_data(data, rows=30 * 8)
    model_dir = work / f"lfm2-{args.model}"
    build_model(args.model, model_dir)
    profile = Profile(start=20, steps=5)
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
    events = [e for e in profile.profiler.key_averages() if e.device_time_total > 0]
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
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
