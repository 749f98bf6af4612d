"""The real CLI: the quickstart, Ctrl-C and one error as separate processes (exit codes and output as a
user sees them); the other commands through the same entry point in-process (`invoke`)."""

from __future__ import annotations

import json

import pytest

from leap_finetune.data.chat_templates import official_template
from leap_finetune.models.tiny import load_tiny_tokenizer
from tests.cli_process import start_cli
from tests.conftest import EXAMPLES, chat, invoke, run_cli, tiny_config, write_config, write_jsonl
from tests.watchdog import Watchdog, communicate, wait_until


@pytest.mark.slow
def test_quickstart_learns_visibly(workdir, examples):
    result = run_cli(str(examples / "quickstart.yaml"), cwd=workdir)
    assert result.returncode == 0, result.stderr[-3000:]
    [run_dir] = list((examples / "outputs" / "quickstart").iterdir())  # beside the config, not in the cwd
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_loss"] <= summary["initial_eval_loss"] / 2
    assert "sample answers before training" in result.stderr and "sample answers after training" in result.stderr
    assert "model: 'The capital of" in result.stderr.split("sample answers after training")[1]
    assert (run_dir / "model" / "model.safetensors").exists()

    # benchmarks: printed before and after, logged by step, scores rise from the baseline
    assert "benchmarks before training (step 0)" in result.stderr and "benchmarks after training" in result.stderr
    for name in ("capitals", "capitals_mcq"):
        key = f"benchmark/{name}/score"
        assert summary["benchmarks"][key] > summary["initial_benchmarks"][key]
        logged = [m for m in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if key in m]
        assert [m["step"] for m in logged] == [0, 135, 270]
        predictions = [json.loads(line) for line in (run_dir / "benchmarks" / f"{name}.jsonl").read_text().splitlines()]
        assert len(predictions) == 12 and {"prompt", "prediction", "reference", "score"} <= set(predictions[0])
    assert summary["benchmarks"]["benchmark/capitals/score"] >= 0.75

    # standalone evaluation of the trained run, from the CLI and from Python
    eval_config = {
        "model_name": "tiny-lfm2",
        "checkpoint": str(run_dir),
        "evals": {
            "max_new_tokens": 24,
            "benchmarks": [
                {
                    "name": "capitals",
                    "path": str(EXAMPLES / "data/quickstart_bench_generation.jsonl"),
                    "metric": "exact_match",
                },
                {
                    "name": "capitals_mcq",
                    "path": str(EXAMPLES / "data/quickstart_bench_mcq.jsonl"),
                    "metric": "logprob_mcq",
                },
            ],
        },
    }
    evaluated = invoke(
        "eval", str(write_config(workdir, eval_config, "eval.yaml")), "--output", "results.json", cwd=workdir
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    results = json.loads((workdir / "results.json").read_text())
    assert results["model"] == str(run_dir / "model")
    for key, value in summary["benchmarks"].items():
        assert results["results"][key] == value
    from leap_finetune.api import run_config

    assert (
        run_config(workdir / "eval.yaml")["results"]["benchmark/capitals_mcq/score"]
        == summary["benchmarks"]["benchmark/capitals_mcq/score"]
    )


def test_validate_exit_codes_and_messages(workdir, examples):
    ok = invoke("validate", str(examples / "quickstart.yaml"), cwd=workdir)
    assert ok.returncode == 0, ok.stderr
    assert "valid" in ok.stderr and not (examples / "outputs").exists()  # validate writes nothing

    write_jsonl(
        workdir / "train.jsonl",
        [chat("q", "a"), {"messages": [{"role": "user", "content": "q"}, {"role": "asistant", "content": "a"}]}],
    )
    config = write_config(workdir, tiny_config())
    bad = run_cli("validate", str(config), cwd=workdir)
    assert bad.returncode == 2
    assert f"{workdir / 'train.jsonl'}, line 2, field 'messages[1].role'" in bad.stderr
    assert "did you mean 'assistant'" in bad.stderr
    assert "Traceback" not in bad.stderr

    debug = invoke("--debug", "validate", str(config), cwd=workdir)  # the traceback, and still exit code 2
    assert debug.returncode == 2 and "Traceback (most recent call last)" in debug.stderr
    assert "did you mean 'assistant'" in debug.stderr


def test_config_mistakes_exit_2_without_traceback_and_write_nothing(workdir):
    write_jsonl(workdir / "train.jsonl", [chat("q", "a")] * 4)
    cases = {
        "bad_value.yaml": tiny_config(training_config={"lr_scheduler_type": "bogus"}),
        "unknown_key.yaml": tiny_config(training_config={"num_train_epoch": 2}),
        "missing_data.yaml": tiny_config(data="nope.jsonl"),
    }
    for name, config in cases.items():
        result = invoke(str(write_config(workdir, config, name)), cwd=workdir)
        assert result.returncode == 2, (name, result.stderr)
        assert result.stderr.startswith("error:") and "Traceback" not in result.stderr, result.stderr
    assert "bogus" in invoke("validate", str(workdir / "bad_value.yaml"), cwd=workdir).stderr
    assert not (workdir / "outputs").exists()


def test_inspect_json_matches_the_official_templates(workdir):
    rows = [
        {
            "messages": [
                {
                    "role": "system",
                    "content": "You may call get_weather.",
                },  # tool lists: tests/e2e/test_tool_calling.py
                {"role": "user", "content": "Weather in Boston?"},
                {
                    "role": "assistant",
                    "content": '<|tool_call_start|>[get_weather(location="Boston")]<|tool_call_end|>',
                },
                {"role": "tool", "content": '{"temperature": 72}'},
                {"role": "assistant", "content": "It's 72 F and sunny."},
            ]
        },
        chat("Hi", "Hello!", system="Be brief."),
    ]
    write_jsonl(workdir / "train.jsonl", rows)
    for model, template in (("tiny-lfm2", "lfm2"), ("tiny-lfm2.5", "lfm2.5")):
        config = write_config(workdir, tiny_config(model_name=model))
        result = invoke("inspect", str(config), "--json", "--rows", "2", cwd=workdir)
        assert result.returncode == 0, result.stderr
        items = json.loads(result.stdout)
        tokenizer = load_tiny_tokenizer(model)
        tokenizer.chat_template = official_template(template)
        assert [item["row"] for item in items] == [0, 1]
        for item, row in zip(items, rows):
            assert item["text"] == tokenizer.apply_chat_template(row["messages"], tokenize=False)
        trained = [[item["text"][a:b] for a, b in item["trained_spans"]] for item in items]
        assert trained[0] == [
            '<|tool_call_start|>[get_weather(location="Boston")]<|tool_call_end|><|im_end|>',
            "It's 72 F and sunny.<|im_end|>",
        ]
        assert trained[1] == ["Hello!<|im_end|>"]


def test_inspect_in_a_terminal_marks_trained_text(workdir):
    write_jsonl(workdir / "train.jsonl", [chat("Hi", "Hello!")])
    result = invoke("inspect", str(write_config(workdir, tiny_config())), cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "Hello!<|im_end|>" in result.stdout and "carries loss" in result.stdout


def test_help_everywhere(workdir):
    for args in (["--help"], ["run", "--help"], ["validate", "--help"], ["inspect", "--help"]):
        result = invoke(*args, cwd=workdir)
        assert result.returncode == 0 and "Usage" in result.stdout, args


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_the_run_resumes_to_the_same_losses(workdir):
    import signal

    from tests.conftest import fact_rows

    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    # (30 steps: the stop lands at the first step boundary after SIGINT, long before the end; each step costs ~0.4 s
    # of CI time over three runs)
    base = {"max_steps": 30, "save_steps": 1000, "logging_steps": 1, "learning_rate": 1e-3}
    reference = invoke(
        str(write_config(workdir, tiny_config(project_name="ref", training_config=base), "ref.yaml")), cwd=workdir
    )
    assert reference.returncode == 0, reference.stderr[-2000:]

    config = write_config(workdir, tiny_config(project_name="int", training_config=base), "int.yaml")
    proc = start_cli(str(config), cwd=workdir)

    def trained_5_steps():
        found = list((workdir / "outputs" / "int").glob("*/metrics.jsonl"))
        return found[0] if found and found[0].read_text().count('"loss"') >= 5 else None

    metrics = wait_until(trained_5_steps, Watchdog(proc.pid, what="the run"), proc=proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = communicate(proc)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-2000:]
    assert "checkpoint saved" in stderr and "Traceback" not in stderr
    run_dir = metrics.parent
    [checkpoint] = list(run_dir.glob("checkpoint-*"))
    stopped_at = int(checkpoint.name.split("-")[1])
    assert 5 <= stopped_at < 30 and (checkpoint / "leap_checkpoint_complete.json").exists()

    resumed_config = write_config(
        workdir,
        tiny_config(project_name="int", training_config={**base, "resume_from_checkpoint": "latest"}),
        "res.yaml",
    )
    resumed = invoke(str(resumed_config), cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    def losses(path):
        return {m["step"]: m["loss"] for m in map(json.loads, path.read_text().splitlines()) if "loss" in m}

    expected = losses(next((workdir / "outputs" / "ref").glob("*/metrics.jsonl")))
    got = losses(metrics)
    assert sorted(got) == list(range(1, 31))
    for step in (stopped_at, stopped_at + 1, stopped_at + 2, 30):
        assert abs(got[step] - expected[step]) <= 1e-5 * max(1.0, abs(expected[step])), step


def test_usage_errors_exit_2(workdir):
    assert invoke("inspect", cwd=workdir).returncode == 2
    assert invoke("validate", "x.yaml", "--bogus", cwd=workdir).returncode == 2
    missing = invoke("nothing.yaml", cwd=workdir)
    assert missing.returncode == 2 and "config file not found" in missing.stderr


def test_hub_model_offline_and_not_cached_is_a_clear_error(workdir):
    write_jsonl(workdir / "train.jsonl", [chat("q", "a")])
    result = invoke("validate", str(write_config(workdir, tiny_config(model_name="LFM2-350M"))), cwd=workdir)
    assert result.returncode == 2
    assert (
        "cannot load the tokenizer 'LiquidAI/LFM2-350M': it is not in the Hugging Face cache, and the Hub cannot "
        "be used (HF_HUB_OFFLINE=1)"
    ) in result.stderr
    assert "Traceback" not in result.stderr


OFFLINE_SCRIPT = """
import json, sys, time
from leap_finetune.cli import main
timings = {}
for name, args in (("plan", ["plan", sys.argv[1], "--gpus", "4"]), ("validate", ["validate", sys.argv[1]]),
                   ("cached", ["validate", sys.argv[3]]), ("hub_dataset", ["plan", sys.argv[4]])):
    started = time.monotonic()
    try:
        main(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code or 0
    print(f"==== {name} done", flush=True)
    print(f"==== {name} done", file=sys.stderr, flush=True)
    timings[name] = {"code": code, "seconds": time.monotonic() - started}
open(sys.argv[2], "w").write(json.dumps(timings))
"""


def test_plan_and_validate_with_no_network_and_hf_hub_offline_unset(tmp_path):
    """Was: `plan examples/grpo_lfm2.yaml --gpus 4` exited 2 after 93 s of Hub retries (it loaded the tokenizer),
    and validate spent as long. The Hub here is a port nobody listens on, HF_HUB_OFFLINE unset; the cache holds
    only leap-test/tiny-cached, which validates from it."""
    import os
    import sys

    from tests.conftest import hub_cache_with_tiny_model
    from tests.watchdog import run

    hub_cache_with_tiny_model(tmp_path / "hf" / "hub", "leap-test/tiny-cached")
    write_jsonl(tmp_path / "train.jsonl", [chat("q", "a")] * 4)
    cached = write_config(tmp_path, tiny_config(model_name="leap-test/tiny-cached"))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"), COLUMNS="200")
    result = run(
        [
            sys.executable,
            "-c",
            OFFLINE_SCRIPT,
            str(EXAMPLES / "grpo_lfm2.yaml"),
            str(tmp_path / "t.json"),
            str(cached),
            str(EXAMPLES / "sft_lfm2.yaml"),
        ],
        what="plan + validate offline",
        cpu_s=600,
        cwd=tmp_path,
        env=env,
    )
    assert (tmp_path / "t.json").exists(), result.stderr[-3000:]
    timings = json.loads((tmp_path / "t.json").read_text())
    plan_out = result.stdout.split("==== plan done")[0]
    validate_err = result.stderr.split("==== plan done")[1].split("==== validate done")[0]
    assert timings["plan"]["code"] == 0, result.stderr[-3000:]
    text = " ".join(plan_out.split())
    assert "rollout server (trl vllm-serve)" in text and "training worker rank 1" in text
    # which rollout engine, and the one measured faster for a 1.2B model (rl/engines.py)
    assert (
        "rollouts: vLLM, server; vLLM server mode (rollouts on their own GPUs) is not measured yet; on one GPU, "
        "faster at LFM2-1.2B size: use_vllm: false (leap-finetune's sampler), 27.8k rollout tokens/s vs 6.0k" in text
    )
    assert (
        "tokens: not counted (the tokenizer of LiquidAI/LFM2-1.2B is not in the Hugging Face cache, and plan does "
        "not download it" in text
    )
    assert timings["validate"]["code"] == 2
    assert (
        "cannot load the tokenizer 'LiquidAI/LFM2-1.2B': it is not in the Hugging Face cache, and the Hub cannot be "
        "used (http://127.0.0.1:9 cannot be reached"
    ) in validate_err
    # huggingface_hub's retries sleep 1+2+4+8+8 = 23 s at least (the bound is those sleeps, not a guess of this
    # machine's speed: after plan's imports validate itself needs a second or two)
    assert timings["validate"]["seconds"] < 23 and "Retrying" not in result.stderr, timings
    assert timings["cached"]["code"] == 0, result.stderr.split("==== validate done")[1]
    assert timings["cached"]["seconds"] < 23, timings  # (read from the cache at once, not after the retries)
    # a Hub dataset: was ~50 s of ten `Retrying in 8s` lines from the datasets library before its clear error
    hub_dataset = " ".join(result.stderr.split("==== cached done")[1].split("==== hub_dataset done")[0].split())
    assert timings["hub_dataset"]["code"] == 2 and timings["hub_dataset"]["seconds"] < 23, timings
    assert "the Hub cannot be used (http://127.0.0.1:9 cannot be reached" in hub_dataset, hub_dataset
