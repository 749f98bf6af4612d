"""A failed evaluation never stops training (sync mode): each failure is logged with its reason and a
traceback file, and after async_eval.failure.max_consecutive failures in a row evaluation is switched off
for the rest of the run while training finishes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers import TrainerCallback

from leap_finetune.api import run_config
from tests.conftest import fact_rows, tiny_config, write_config, write_jsonl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class BreakPredictionsFile(TrainerCallback):
    """After the first evaluation, the benchmark's predictions file becomes a folder: every later evaluation
    raises (IsADirectoryError) in the benchmark code itself."""

    def __init__(self, run_root: Path):
        self.run_root = run_root

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            target = Path(args.output_dir) / "benchmarks" / "capitals.jsonl"
            if target.exists():
                target.unlink()
            target.mkdir(parents=True)


def test_a_failing_benchmark_does_not_stop_training_and_is_switched_off(workdir, capfd):
    write_jsonl(workdir / "train.jsonl", fact_rows(24))
    shutil.copy(EXAMPLES / "data" / "quickstart_bench_generation.jsonl", workdir / "bench.jsonl")
    config = tiny_config(
        training_config={"max_steps": 8, "save_strategy": "no"},
        evals={
            "max_new_tokens": 4,
            "eval_steps": 2,
            "benchmarks": [{"name": "capitals", "path": "bench.jsonl", "metric": "exact_match", "limit": 4}],
        },
        async_eval={"mode": "sync", "failure": {"max_consecutive": 2}},
    )
    summary = run_config(write_config(workdir, config), callbacks=[BreakPredictionsFile(workdir)])
    assert summary["global_step"] == 8  # training finished
    run_dir = Path(summary["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scored = sorted(r["step"] for r in records if "benchmark/capitals/score" in r)
    failed = {r["step"]: r["benchmark/failures"] for r in records if "benchmark/failures" in r}
    assert scored == [0]  # before training; the evaluations at steps 2 and 4 failed, then none ran
    assert failed == {2: 1.0, 4: 2.0}
    assert "IsADirectoryError" in (run_dir / "benchmarks" / "failures" / "step-2.txt").read_text()
    # the evaluation that succeeded is also kept per training step in the run folder
    saved = json.loads((run_dir / "benchmarks" / "results" / "step-0.json").read_text())
    assert saved["step"] == 0 and "benchmark/capitals/score" in saved["results"]
    assert sorted(p.name for p in (run_dir / "benchmarks" / "results").iterdir()) == ["step-0.json"]
    err = capfd.readouterr().err
    assert "evaluation at step 2 (during training) failed: IsADirectoryError" in err
    assert "evaluation switched off for the rest of the run after 2 failed evaluations in a row" in err
    assert all(r.get("loss") is not None for r in records if r.get("step") == 8 and "loss" in r)
