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


HEAVY = ("torch", "torch._dynamo", "peft", "trl.trainer", "datasets", "accelerate")


def test_validate_and_plan_import_no_training_library_once_their_answers_are_kept(tmp_path, monkeypatch):
    """Was: `validate` of the quickstart took 4.5-5 s warm, ~3 s of it importing TRL, peft, torch and torch's
    compiler for questions whose answers do not change (memo.py). Once asked (here in this process), validate and
    plan in a fresh process import none of them - plan for a GPU too (it imported torch for the model's shape and for
    whether torch has varlen attention: 3.8 s against 0.9 s, the GPU machine's slow start-up)."""
    import os

    from tests.conftest import invoke

    monkeypatch.setenv("LEAP_FINETUNE_CACHE", str(tmp_path / "cache"))
    config = str(ROOT / "examples" / "quickstart.yaml")
    assert invoke("validate", config, cwd=tmp_path).returncode == 0  # (the libraries asked, the answers kept)
    # a GPU machine's plan (here: planned for one GPU) predicts memory from the model's shape, measured once (this
    # process's own shapes forgotten: an earlier test's would leave the kept answers empty)
    from leap_finetune.memory import plan

    monkeypatch.setattr(plan, "_shapes", {})
    assert invoke("plan", config, "--gpus", "1", cwd=tmp_path).returncode == 0
    code = (
        "import sys\n"
        "from leap_finetune.cli import main\n"
        "for command in sys.argv[2:]:\n"
        "    try:\n        main([*command.split(), sys.argv[1]])\n"
        "    except SystemExit as e:\n        assert not e.code, e.code\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, config, "validate", "plan", "plan --gpus=1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "HEAVY []" in done.stdout, done.stdout[-2000:]


def test_an_answer_is_kept_per_question_and_a_refusal_never(tmp_path, monkeypatch):
    """A changed training_config is a new question (asked of the libraries again); a refusal is raised every time."""
    from leap_finetune import memo
    from leap_finetune.errors import LeapError

    monkeypatch.setenv("LEAP_FINETUNE_CACHE", str(tmp_path))
    asked = []

    def answer(value):
        def ask():
            asked.append(value)
            if value == "bad":
                raise LeapError("refused", where="x")
            return {"lr": value}

        return ask

    assert memo.remembered("values", ["sft", 1e-3], answer(1e-3)) == {"lr": 1e-3}
    assert memo.remembered("values", ["sft", 1e-3], answer(1e-3)) == {"lr": 1e-3} and asked == [1e-3]
    assert memo.remembered("values", ["sft", 2e-3], answer(2e-3)) == {"lr": 2e-3} and asked == [1e-3, 2e-3]
    for _ in range(2):
        try:
            memo.remembered("values", ["sft", "bad"], answer("bad"))
        except LeapError:
            pass
    assert asked.count("bad") == 2  # (never stored)
    # YAML's date and the same text are two questions (were one: the date was answered as the text)
    import datetime

    memo.remembered("values", ["sft", "2026-01-01"], answer("text"))
    assert memo.remembered("values", ["sft", datetime.date(2026, 1, 1)], answer("date")) == {"lr": "date"}
    monkeypatch.setenv("LEAP_FINETUNE_MEMO", "0")
    memo.remembered("values", ["sft", 1e-3], answer(1e-3))
    assert asked.count(1e-3) == 2  # (off: asked every time)
