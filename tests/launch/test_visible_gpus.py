"""The GPUs the driver sees, counted without importing torch (launch/devices.py `visible_gpus`): from `nvidia-smi -L`,
as CUDA enumerates them under CUDA_VISIBLE_DEVICES (parsed as torch parses it: indices or UUID prefixes, in order,
up to the first entry that names no GPU; a repeated entry makes it empty). There is no GPU here: a stand-in `nvidia-smi` prints what the real one prints on
a two-GPU machine; the count must come from it, and torch must stay unimported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from leap_finetune.launch.devices import count_visible

GPUS = ["GPU-aaaa-1111", "GPU-bbbb-2222"]


@pytest.mark.parametrize(
    ("visible", "count"),
    [
        (None, 2),
        ("1", 1),
        ("1,0", 2),
        ("0,5,1", 1),  # (the list ends at a GPU the machine does not have)
        ("0,0", 0),  # (a repeated entry: CUDA sees none)
        ("1gpu2,0", 2),  # (leading digits, as strtoul reads them)
        ("abc", 0),
        ("GPU-bbbb", 1),
        ("GPU-bbbb,0", 1),  # (a UUID list ends at an entry that is not one)
        ("GPU-", 0),  # (a prefix of both: ambiguous)
        ("MIG-aaaa", None),  # (MIG: asked of torch)
    ],
)
def test_cuda_visible_devices_counts_as_cuda_counts(visible, count):
    assert count_visible(GPUS, visible) == count


def test_the_count_comes_from_nvidia_smi_without_importing_torch(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa-1111)"\n'
        'echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb-2222)"\n'
    )
    smi.chmod(0o755)
    code = (
        "import sys; from leap_finetune.launch.devices import visible_gpus; "
        "print(visible_gpus(), 'torch' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = f"{tmp_path}{os.pathsep}{env['PATH']}"
    seen = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert seen.stdout.split() == ["2", "False"], seen.stderr
    one = subprocess.run(
        [sys.executable, "-c", code], env={**env, "CUDA_VISIBLE_DEVICES": "1"}, capture_output=True, text=True
    )
    assert one.stdout.split() == ["1", "False"], one.stderr
