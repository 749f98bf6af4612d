"""A developer's tool for the benchmarks in bench/: with LEAP_FINETUNE_PROFILE=DIR set, each worker writes
its step times (`steps-rank{R}.json`) and a torch.profiler summary of a few steps after warm-up
(`profile-rank{R}.txt`: GPU time by kernel, the share of NCCL communication). Not a user-facing key."""

from __future__ import annotations

import json
import time
from pathlib import Path

from transformers import TrainerCallback


class StepProfile(TrainerCallback):
    def __init__(self, folder: Path, first: int = 20, steps: int = 4):
        self.folder, self.first, self.steps = folder, first, steps
        self.times: list[float] = []
        self._start = None
        self._profiler = None

    def _rank(self) -> int:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()
        if state.global_step == self.first:
            import torch

            self._profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            )
            self._profiler.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)
        if self._profiler is not None and state.global_step == self.first + self.steps:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self._profiler.__exit__(None, None, None)
            self._write_profile(self._profiler)
            self._profiler = None

    def _write_profile(self, profiler) -> None:
        events = profiler.key_averages()
        device_time = lambda e: getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)  # noqa: E731
        kernels = [e for e in events if device_time(e) > 0 and e.device_type.name == "CUDA"]
        total = sum(device_time(e) for e in kernels)
        nccl = sum(device_time(e) for e in kernels if "nccl" in e.key.lower())
        wall = sum(self.times[self.first : self.first + self.steps])
        lines = [
            f"steps {self.first + 1}-{self.first + self.steps}: wall {wall * 1e3:.0f} ms, GPU kernel time "
            f"{total / 1e3:.0f} ms, of which NCCL {nccl / 1e3:.0f} ms ({100 * nccl / max(total, 1):.1f}%)",
            "",
        ]
        for e in sorted(kernels, key=device_time, reverse=True)[:25]:
            lines.append(f"{device_time(e) / 1e3:10.1f} ms {e.count:6d}x  {e.key[:110]}")
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"profile-rank{self._rank()}.txt").write_text("\n".join(lines) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"steps-rank{self._rank()}.json").write_text(json.dumps(self.times))
