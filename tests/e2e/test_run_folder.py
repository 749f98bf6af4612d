"""What a person reads in the run folder: train.log, the plots."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl
from tests.launch.facts_agree import assert_plan_run_and_card_agree


def test_train_log_holds_the_runs_output_as_plain_text_and_a_resume_appends(tmp_path):
    from leap_finetune.api import plan_config

    write_jsonl(tmp_path / "train.jsonl", fact_rows(24))
    config = write_config(
        tmp_path,
        tiny_config(
            data="train.jsonl",
            dataset={"path": "train.jsonl", "test_size": 4},
            training_config={"max_steps": 4, "save_steps": 2, "logging_steps": 1, "eval_steps": 2},
        ),
    )
    planned = plan_config(config)
    first = invoke(str(config), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    [run_dir] = list((tmp_path / "outputs" / "test").iterdir())
    assert_plan_run_and_card_agree(planned, run_dir)
    log = (run_dir / "train.log").read_text()
    assert log.startswith("==== ") and "leap-finetune" in log.splitlines()[0]
    for printed in ("resolved config", "data: 24 rows read", f"run: {run_dir}", "done: 4 steps"):
        assert printed in log, printed
    assert "\x1b[" not in log and "\r" not in log
    # the end of run report, in the log too
    report = log[log.index("run report") :]
    assert "SFT of tiny-lfm2, full fine-tune" in report and "4 steps in" in report and "tokens/s" in report
    assert "(best " in report and "at step" in report and f"run folder {run_dir}" in report
    # every line the run printed is in the log, in order
    printed = [line.strip() for line in first.stderr.splitlines() if line.strip()]
    logged = [line.strip() for line in log.splitlines() if line.strip()]
    position = 0
    for line in printed:
        position = logged.index(line, position) + 1
    # a resumed run appends (a header of its own), the first run's lines are kept
    assert _series(run_dir / "plots" / "loss.png") == {"train loss": 4, "eval loss": 3}  # (step 0 is the baseline)
    more = write_config(
        tmp_path,
        tiny_config(
            data="train.jsonl",
            output_dir=str(run_dir),
            dataset={"path": "train.jsonl", "test_size": 4},
            training_config={
                "max_steps": 6,
                "save_steps": 2,
                "logging_steps": 1,
                "eval_steps": 2,
                "resume_from_checkpoint": "latest",
            },
        ),
        name="more.yaml",
    )
    second = invoke(str(more), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    log = (run_dir / "train.log").read_text()
    assert log.count("==== ") == 2 and "done: 4 steps" in log and "done: 6 steps" in log
    assert log.index("done: 4 steps") < log.index("resuming from") < log.index("done: 6 steps")
    # the plots were drawn again with the resumed steps
    assert _series(run_dir / "plots" / "loss.png") == {"train loss": 6, "eval loss": 4}
    assert _series(run_dir / "plots" / "learning_rate.png") == {"learning rate": 6}


def _series(path) -> dict:
    """A valid PNG's recorded series (label -> points)."""
    with Image.open(path) as image:
        image.load()  # decodes every byte: a truncated file fails here
        assert image.format == "PNG" and image.size[0] > 300
        return json.loads(image.text["leap-finetune series"])


def test_benchmark_and_reward_plots_draw_every_series(tmp_path):
    from leap_finetune.recipes.plots import write_plots

    records = []
    for step in range(0, 21, 5):
        records.append(
            {
                "step": step,
                "eval_loss": 2 - step / 20,
                "benchmark/capitals/score": step / 20,
                "benchmark/mcq/score": 0.25 + step / 40,
                "eval_rewards/accuracies": step / 20,
            }
        )
        if step:
            records.append(
                {
                    "step": step,
                    "loss": 1.0 / step,
                    "learning_rate": 1e-3,
                    "num_input_tokens_seen": 100 * step,
                    "rewards/chosen": 0.1 * step,
                    "rewards/rejected": -0.1 * step,
                    "rewards/margins": 0.2 * step,
                }
            )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"step": 2')
    written = {p.name for p in write_plots(tmp_path)}
    assert written == {"loss.png", "learning_rate.png", "benchmarks.png", "rewards.png"}
    assert _series(tmp_path / "plots" / "benchmarks.png") == {"capitals": 5, "mcq": 5}
    assert _series(tmp_path / "plots" / "rewards.png") == {
        "rewards/chosen": 4,
        "rewards/rejected": 4,
        "rewards/margins": 4,
        "eval_rewards/accuracies": 5,
    }
    assert _series(tmp_path / "plots" / "loss.png") == {"train loss": 4, "eval loss": 5}
    assert not list((tmp_path / "plots").glob(".*"))  # no partial files left


@pytest.mark.parametrize(
    "training_type, metrics, expected",
    [
        (
            "dpo",
            {"eval_rewards/accuracies": 0.9, "eval_rewards/margins": 1.5},
            ["reward accuracies (held out) | 0.500 -> 0.900", "reward margins (held out) | 0.000 -> 1.500"],
        ),
        (
            "kto",
            {"eval_rewards/chosen": 0.8, "eval_rewards/rejected": -0.4},
            ["reward gap, desirable - undesirable (held out) | 0.000 -> 1.200"],
        ),
    ],
)
def test_the_end_report_shows_the_preference_metrics(tmp_path, training_type, metrics, expected):
    import io

    from rich.console import Console

    from leap_finetune.launch.reports.report import end_report
    from leap_finetune.validate.loader import load_config

    (tmp_path / "train.jsonl").write_text("")
    resolved = load_config(
        tiny_config(
            training_type=training_type,
            data=str(tmp_path / "train.jsonl"),
            training_config={"extends": f"DEFAULT_{training_type.upper()}"},
        )
    )
    starts = {k: (0.5 if k.endswith("accuracies") else 0.0) for k in metrics}
    summary = {
        "run_dir": str(tmp_path),
        "global_step": 10,
        "train_runtime_s": 5.0,
        "tokens_seen": 1000,
        "eval_loss": 0.5,
        "initial_eval_loss": 0.7,
        "eval_metrics": metrics,
        "initial_eval_metrics": starts,
        "model_dir": str(tmp_path / "model"),
    }
    out = io.StringIO()
    end_report(Console(file=out, width=200), resolved, summary)
    text = " ".join(out.getvalue().replace("│", "|").split())
    for row in expected + ["10 steps in 5.0 s, 200 tokens/s", "eval loss | 0.7000 -> 0.5000"]:
        assert row in text, (row, text)


def test_tensorboard_gets_the_run_and_its_resolved_config(tmp_path):
    """report_to: tensorboard - the run's scalars and leap-finetune's resolved config land in the run folder's
    tensorboard/ (read back with TensorBoard's own reader); the trainer's arguments carry the run's name and
    project for the trackers that use them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_jsonl(tmp_path / "train.jsonl", fact_rows(16))
    config = write_config(
        tmp_path,
        tiny_config(
            data="train.jsonl",
            project_name="tracked",
            training_config={"max_steps": 3, "logging_steps": 1, "report_to": "tensorboard"},
        ),
    )
    result = invoke(str(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [run_dir] = list((tmp_path / "outputs" / "tracked").iterdir())
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    tags = events.Tags()
    assert "train/loss" in tags["scalars"] and len(events.Scalars("train/loss")) == 3
    [text] = [t for t in tags["tensors"] if t.startswith("leap_finetune/config")]
    config_text = events.Tensors(text)[0].tensor_proto.string_val[0].decode()
    assert '"project_name": "tracked"' in config_text and '"max_steps": 3' in config_text
    from leap_finetune.recipes import recipe
    from leap_finetune.validate.loader import load_config

    resolved = load_config(config).model_copy(update={"run_name": run_dir.name, "run_dir": str(run_dir)})
    args = recipe("sft").training_arguments(resolved, run_dir=str(run_dir), has_eval=False)
    assert (args["run_name"], args["project"]) == (run_dir.name, "tracked")
