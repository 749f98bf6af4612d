"""The package's front door: `import leap_finetune` is quick and every name it lists resolves; every bench script
imports (they are run on the GPU machine, where an import error costs device time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_exported_name_resolves_to_the_function_of_its_module():
    import importlib

    import leap_finetune

    api, export = importlib.import_module("leap_finetune.api"), importlib.import_module("leap_finetune.export")
    assert leap_finetune.plan_config is api.plan_config and leap_finetune.run_config is api.run_config
    assert leap_finetune.export_model is export.export_model
    for name in leap_finetune.__all__:
        assert getattr(leap_finetune, name) is not None, name


def test_import_leap_finetune_does_not_import_torch():
    code = "import sys, leap_finetune; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_every_bench_script_imports(monkeypatch):
    import importlib

    scripts = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
    assert {"grpo_rollout", "vllm_runs", "sft_throughput"} <= set(scripts)
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    for name in scripts:  # (in this process: torch is imported already, a subprocess would pay it again)
        importlib.import_module(name)
