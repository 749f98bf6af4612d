"""metric_for_best_model on a benchmark's score (`benchmark/NAME`): the best checkpoint is the one whose step
scored highest on that benchmark (not the last, not the base model's score before training), kept by the rotation
and loaded at the end with load_best_model_at_end; validate refuses the settings under which that checkpoint would
not exist. A custom metric plays a known score series so the choice is checkable (the real metrics: every other
benchmark test)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.validate.loader import load_config
from tests.conftest import fact_rows, tiny_config, write_config, write_jsonl

# One evaluation per call of the metric (one row; the check at load time is told apart: it is asked with the
# reference as the prediction, which the tiny model never writes). Before training, then steps 2, 4, 6.
SERIES_METRIC = """
from pathlib import Path

SERIES = [0.9, 0.3, 0.8, 0.5]


def played(prediction, reference, row):
    if prediction == reference:
        return 1.0
    counter = Path(__file__).with_name("calls.txt")
    calls = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(calls + 1))
    return SERIES[min(calls, len(SERIES) - 1)]
"""


def _config(workdir: Path, **training) -> Path:
    write_jsonl(workdir / "train.jsonl", fact_rows(40))
    write_jsonl(workdir / "bench.jsonl", [{"messages": [{"role": "user", "content": "Say it"},
                                                        {"role": "assistant", "content": "§never§"}]}])  # fmt: skip
    (workdir / "series.py").write_text(SERIES_METRIC, encoding="utf-8")
    config = tiny_config(
        dataset={"path": "train.jsonl", "test_size": 4},
        training_config={"max_steps": 6, "save_steps": 2, "eval_steps": 2, "save_total_limit": 1,
                         "load_best_model_at_end": True, "metric_for_best_model": "benchmark/played", **training},
        evals={"max_new_tokens": 2, "benchmarks": [{"name": "played", "path": "bench.jsonl",
                                                    "metric": "./series.py::played"}]},
    )  # fmt: skip
    return write_config(workdir, config)


def test_the_best_checkpoint_is_the_step_with_the_best_benchmark_score(workdir):
    from safetensors.torch import load_file

    from leap_finetune.api import run_config

    summary = run_config(_config(workdir))
    run = Path(summary["run_dir"])
    state = json.loads((run / "checkpoint-6" / "trainer_state.json").read_text())
    # 0.9 was the base model's (before training: no checkpoint); of steps 2, 4, 6 (0.3, 0.8, 0.5) step 4 is best
    assert state["best_metric"] == 0.8 and state["best_global_step"] == 4
    assert state["best_model_checkpoint"].endswith("checkpoint-4")
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]  # best + newest
    # load_best_model_at_end: the saved model is checkpoint-4's weights, not the last step's
    best = load_file(run / "checkpoint-4" / "model.safetensors")
    final = load_file(run / "model" / "model.safetensors")
    last = load_file(run / "checkpoint-6" / "model.safetensors")
    name = next(k for k in best if k.endswith("q_proj.weight"))
    assert best[name].equal(final[name]) and not last[name].equal(final[name])


@pytest.mark.parametrize(
    ("training", "async_eval", "said"),
    [
        (
            {"save_steps": 4},
            None,
            "scored every 2 steps, but checkpoints are saved with save_strategy steps, save_steps 4",
        ),
        ({"save_strategy": "no", "load_best_model_at_end": False}, None, "checkpoints are saved never"),
        ({}, {"mode": "reserved", "vllm_gpus": 0}, "async_eval.mode is reserved"),
        ({"metric_for_best_model": "benchmark/nope"}, None, "or a benchmark's score: benchmark/played"),
    ],
)
def test_settings_without_the_best_steps_checkpoint_are_refused(workdir, training, async_eval, said):
    config = _config(workdir, **training)
    if async_eval:
        import yaml

        raw = yaml.safe_load(config.read_text())
        config.write_text(yaml.safe_dump({**raw, "async_eval": async_eval}))
    with pytest.raises(LeapError) as err:
        load_config(config)
    assert said in " ".join(err.value.format().split())


def test_a_best_benchmark_over_several_workers_is_refused(workdir):
    """The benchmarks run on rank 0 only: the best checkpoint could not be chosen on every rank alike."""
    import yaml

    config = _config(workdir)
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "ray": {"num_workers": 2}}))
    with pytest.raises(LeapError, match="the run has 2 workers"):
        load_config(config)
