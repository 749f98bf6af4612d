"""`leap-finetune eval` on what training leaves: a LoRA run's checkpoint-N and adapter/ (loaded over
the base model), and a custom metric that raises (counted, never hidden)."""

from __future__ import annotations

import json
from pathlib import Path

from leap_finetune.api import evaluate_config, run_config
from tests.conftest import chat, fact_rows, tiny_config, write_config, write_jsonl


def _bench(folder: Path) -> dict:
    words = ["red", "blue", "teal", "gold"]
    write_jsonl(folder / "bench.jsonl", [chat(f"Say {w} twice.", f"{w} {w}") for w in words])
    return {"max_new_tokens": 6, "benchmarks": [{"name": "echo", "path": "bench.jsonl", "metric": "rouge_l"}]}


def test_a_lora_checkpoint_and_adapter_are_evaluated_over_their_base_model(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(32))
    evals = _bench(workdir)
    summary = run_config(
        write_config(
            workdir,
            tiny_config(
                peft_config={"extends": "DEFAULT_LORA", "r": 8, "lora_dropout": 0.0},
                training_config={"max_steps": 30, "save_steps": 30, "learning_rate": 1e-2},
                evals={**evals, "eval_steps": 1000},
            ),
        )
    )
    run_dir = Path(summary["run_dir"])
    trained = summary["benchmarks"]["benchmark/echo/score"]
    assert trained > summary["initial_benchmarks"]["benchmark/echo/score"]
    assert (run_dir / "checkpoint-30" / "adapter_config.json").exists()
    assert not (run_dir / "checkpoint-30" / "config.json").exists()  # an adapter, not a model

    for folder in (run_dir / "checkpoint-30", run_dir / "adapter"):
        report = evaluate_config(
            write_config(workdir, {"model_name": "tiny-lfm2", "checkpoint": str(folder), "evals": evals}, "eval.yaml")
        )
        assert report["model"] == str(folder) and report["base_model"] == "tiny-lfm2"
        assert report["results"]["benchmark/echo/score"] == trained
    # a project folder means its newest run's final (merged) model
    project = evaluate_config(
        write_config(
            workdir, {"model_name": "tiny-lfm2", "checkpoint": str(run_dir.parent), "evals": evals}, "project.yaml"
        )
    )
    assert project["model"] == str(run_dir / "model")
    assert project["results"]["benchmark/echo/score"] == trained
    base = evaluate_config(write_config(workdir, {"model_name": "tiny-lfm2", "evals": evals}, "base.yaml"))
    assert base["results"]["benchmark/echo/score"] == summary["initial_benchmarks"]["benchmark/echo/score"]


def test_a_custom_metric_that_raises_is_counted_and_shown(workdir, capsys):
    evals = _bench(workdir)
    # passes the check on references (prediction == reference), raises on any other answer
    (workdir / "strict.py").write_text(
        "def score(prediction, reference, row):\n"
        "    if prediction != reference:\n"
        "        raise ValueError('cannot score ' + repr(prediction))\n"
        "    return 1.0\n"
    )
    evals["benchmarks"][0]["metric"] = "./strict.py::score"
    report = evaluate_config(write_config(workdir, {"model_name": "tiny-lfm2", "evals": evals}), output="results.json")
    results = report["results"]
    assert results["benchmark/echo/metric_errors"] == 4 and results["benchmark/echo/score"] == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "custom metric of benchmark 'echo' raised on 4 of 4 row(s)" in err
    assert f"predictions (prompt, prediction, reference, score per row): {workdir / 'results.predictions'}/" in err
    predictions = [
        json.loads(line) for line in (workdir / "results.predictions" / "echo.jsonl").read_text().splitlines()
    ]
    assert all(p["metric_error"].startswith("ValueError: cannot score") for p in predictions)
