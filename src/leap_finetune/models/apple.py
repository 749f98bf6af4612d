"""Apple Silicon: training on the Mac's GPU through PyTorch's `mps` backend where there is no CUDA.

Untested on hardware here (the project's machines have no Mac): the choice is made as the Trainer makes it -
`use_cpu: false` on a machine with MPS puts the model on `mps` - and the tests fake the availability. What runs
there and what does not: docs/install.md ("Apple Silicon").
"""

from __future__ import annotations

import platform
import sys


def on_apple_silicon() -> bool:
    """An arm64 Mac (where every PyTorch wheel has MPS), said without importing torch (the driver's plan)."""
    return sys.platform == "darwin" and platform.machine() == "arm64"


def mps_available() -> bool:
    """The training process's answer: PyTorch's MPS backend is built and usable here."""
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def mps_bf16() -> bool:
    """bf16 on this Mac's GPU (macOS 14 and later); float32 otherwise."""
    import torch

    try:
        torch.ones(1, dtype=torch.bfloat16, device="mps")
    except (RuntimeError, TypeError):
        return False
    return True
