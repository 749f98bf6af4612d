"""The steps `plan` and the run's `run:` line announce are the steps the trainer trains. GRPO's batch counts
completions (each prompt num_generations times, TRL's RepeatSampler), not prompts: the plan once said
ceil(prompts / batch) - 4 steps where TRL trained 16."""

from __future__ import annotations

import io
import json

from rich.console import Console

from leap_finetune.api import plan_config, run_config
from tests.conftest import invoke, write_config, write_jsonl


def _grpo_config(folder, prompts: int, **training):
    write_jsonl(folder / "prompts.jsonl", [{"prompt": f"Name color {i}.", "solution": "teal"} for i in range(prompts)])
    return write_config(
        folder,
        {
            "project_name": "steps",
            "model_name": "tiny-lfm2",
            "training_type": "grpo",
            "dataset": {"path": "prompts.jsonl"},
            "rewards": ["accuracy"],
            "training_config": {
                "use_vllm": False,
                "max_completion_length": 4,
                "num_train_epochs": 1,
                "logging_steps": 1,
                "save_strategy": "no",
                **training,
            },
        },
    )


def test_grpo_plan_says_the_steps_trl_trains(workdir):
    """5 prompts, 2 completions per device x 2 accumulation, num_generations 2, num_iterations 2: a generation batch
    is 4 completions = 2 prompts, so 2 whole ones (the 5th prompt is left out by TRL's sampler), each trained twice
    over 2 accumulation micro-steps: 4 optimizer steps (ceil(prompts / batch) said 2)."""
    path = _grpo_config(
        workdir, 5, per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=2, num_iterations=2
    )
    plan = plan_config(path)
    assert (plan["steps_per_epoch"], plan["total_steps"], plan["batch"]["global"], plan["batch"]["unit"]) == (
        4,
        4,
        4,
        "completions",
    )
    assert plan["last_batch"].startswith(
        "last batch: 1 prompt(s) per epoch do not fill a generation batch of 2 prompts"
    )

    printed = io.StringIO()
    summary = run_config(path, console=Console(file=printed, width=200))
    assert summary["global_step"] == plan["total_steps"]
    text = printed.getvalue()
    assert "5 prompts" in text and "4 steps of 4 completions" in text, text
    assert "done: 4 steps" in text and "topped up" not in text, text


def test_grpo_plan_of_the_examples(examples):
    """Without max_steps, grpo_tiny.yaml's 64 prompts x 8 generations in steps of 16 completions are 32 steps;
    grpo_lfm2.yaml on 4 GPUs (2 training workers x 8 completions): 8 prompts x 8 generations in steps of 16 are
    4 steps, and no batch is partial (the plan said 1 step, "topped up to 16")."""
    tiny = invoke("plan", "grpo_tiny.yaml", "--set", "training_config.max_steps=-1", "--json", cwd=examples)
    assert tiny.returncode == 0, tiny.stderr
    tiny = json.loads(tiny.stdout)
    assert (tiny["rows"], tiny["steps_per_epoch"], tiny["total_steps"], tiny["last_batch"]) == (64, 32, 32, None)

    big = invoke("plan", "grpo_lfm2.yaml", "--gpus", "4", cwd=examples)
    assert big.returncode == 0, big.stderr
    text = " ".join(big.stdout.split())
    assert "= 16 completions per step (2 prompts x 8 generations); 8 prompts -> 4 steps per epoch" in text, text
    assert "last batch" not in text


def test_grpo_prompts_that_fill_no_generation_batch_are_refused(workdir):
    """3 prompts and generation batches of 4 prompts (8 completions / 2): TRL trains nothing (a ValueError without
    max_steps, "stopped at step 0" with it); validate and plan say so, exit 2."""
    path = _grpo_config(workdir, 3, per_device_train_batch_size=8, num_generations=2, max_steps=2)
    for command in ("validate", "plan"):
        result = invoke(command, str(path), cwd=workdir)
        error = " ".join(result.stderr.split())
        assert result.returncode == 2 and "Traceback" not in error, error
        assert "the training data has 3 prompt(s), fewer than one generation batch of 4 prompts" in error, error


def test_batch_tokens_steps_without_the_rows_lengths_are_said_to_be_an_upper_bound(workdir):
    """Rows counted without a tokenizer have no lengths to group: one row per micro-batch is the most steps there
    can be, and the plan says so instead of printing it as the count."""
    from leap_finetune.launch.steps import epoch_steps
    from leap_finetune.validate.loader import load_config

    write_jsonl(workdir / "rows.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 2)
    config = write_config(
        workdir,
        {
            "project_name": "bound",
            "model_name": "tiny-lfm2",
            "training_type": "sft",
            "dataset": {"path": "rows.jsonl"},
            "training_config": {"batch_tokens": 4096, "max_length": 1024},
        },
    )
    resolved = load_config(config)
    bound = epoch_steps(resolved, 40, 1, None, gpu=False)
    assert bound.steps_per_epoch == 40 and "at most 40" in bound.last_batch and "run" in bound.last_batch
    exact = epoch_steps(resolved, 40, 1, [100] * 40, gpu=False)  # 40 rows of 100 tokens: one micro-batch
    assert exact.steps_per_epoch == 1 and not (exact.last_batch or "").startswith("steps: at most")
    over = epoch_steps(resolved, 3, 1, [100, 5000, 200], gpu=False)  # (max_length null: a row over the budget)
    assert "1 row(s) cost more than batch_tokens 4096 (the most 5000 tokens)" in over.last_batch
    assert "or set max_length to cut rows" in over.last_batch  # (a text row can be cut; an image row cannot)
    import pytest

    from leap_finetune.errors import LeapError

    resolved.training["dataloader_drop_last"] = True
    with pytest.raises(LeapError, match="fewer than the 2 workers, and dataloader_drop_last: true drops them all"):
        epoch_steps(resolved, 40, 2, [100] * 40, gpu=False)
