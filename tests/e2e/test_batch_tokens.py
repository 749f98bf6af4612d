"""`batch_tokens` through the real SFT trainer (CPU, tiny LFM2): micro-batches within the budget, every row trained
once per epoch, the steps the driver announced, a loss that falls, a resume that continues the same run, and bad
values refused before anything is written."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from transformers import TrainerCallback

from leap_finetune.api import plan_config, run_config
from leap_finetune.errors import LeapError
from leap_finetune.validate.loader import load_config
from tests.conftest import StopAt, tiny_config, write_config
from tests.launch.facts_agree import assert_plan_run_and_card_agree

BUDGET = 256


@pytest.fixture
def chat_data(workdir):
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    rows = []
    for _ in range(40):
        question = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
        answer = " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))
        rows.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    (workdir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return workdir


def _config(folder: Path, name: str, **training) -> Path:
    config = tiny_config(
        project_name=name,
        training_config={
            "batch_tokens": BUDGET,
            "padding_free": True,  # (flat batches, a GPU's default, on the CPU)
            "max_steps": -1,
            "num_train_epochs": 2,
            "learning_rate": 3e-3,
            "save_strategy": "steps",
            "save_steps": 3,
        },
    )
    del config["training_config"]["per_device_train_batch_size"]
    config["training_config"].update(training)
    return write_config(folder, config, f"{name}.yaml")


class Batches(TrainerCallback):
    """The micro-batches the trainer's data loader will hand out this epoch, with each row's token count."""

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.lengths = [len(ids) for ids in train_dataloader.dataset["input_ids"]]
        self.groups = list(train_dataloader.batch_sampler)


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_micro_batches_hold_the_budget_every_row_trains_once_per_epoch_and_the_loss_falls(chat_data):
    config = _config(chat_data, "tokens")
    planned = plan_config(config)
    batches = Batches()
    summary = run_config(config, callbacks=[batches])
    run_dir = Path(summary["run_dir"])

    groups, lengths = batches.groups, batches.lengths
    assert max(sum(lengths[i] for i in group) for group in groups) <= BUDGET
    assert sorted(i for group in groups for i in group) == list(range(40))  # every row, once (none dropped)
    assert len(groups) < 40 / 4  # more rows per micro-batch than tiny_config's 4: the budget fills them
    # the driver's count (plan, the run's first line) is the trainer's
    assert planned["steps_per_epoch"] == len(groups) and summary["global_step"] == 2 * len(groups)
    two = plan_config(config, gpus=2)  # each of 2 workers takes every other group; the last round topped up
    assert two["steps_per_epoch"] == -(-len(groups) // 2) and two["batch"]["per_device"] == f"<= {BUDGET} tokens"
    assert (two["last_batch"] is not None) == (len(groups) % 2 == 1)
    log = (run_dir / "train.log").read_text()
    assert re.search(rf"{2 * len(groups)} steps of ~\d+ rows \(micro-batches of <= {BUDGET} tokens", log)
    # two epochs: every row's tokens twice (the log's count of the prepared rows)
    tokens = int(re.search(r"40 rows, ([\d,]+) tokens", log).group(1).replace(",", ""))
    assert summary["tokens_seen"] == 2 * tokens
    losses = [r["loss"] for r in _records(run_dir) if "loss" in r]
    assert losses[-1] < losses[0] * 0.8
    assert_plan_run_and_card_agree(planned, run_dir)


def test_an_interrupted_run_resumes_to_the_uninterrupted_losses(chat_data):
    full = run_config(_config(chat_data, "whole"))
    cut = run_config(_config(chat_data, "cut"), callbacks=[StopAt(3)])
    assert cut["global_step"] == 3
    resumed = run_config(_config(chat_data, "cut", resume_from_checkpoint="latest"))
    assert resumed["global_step"] == full["global_step"] > 3

    def losses(summary):
        return {r["step"]: r["loss"] for r in _records(Path(summary["run_dir"])) if "loss" in r}

    expected, got = losses(full), losses(resumed)
    assert sorted(got) == sorted(expected)
    for step, loss in expected.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), step


@pytest.mark.parametrize(
    ("training", "message", "fix"),
    [
        (
            {"batch_tokens": "16k"},
            "batch_tokens is '16k': expected a whole number of tokens >= max_length (128)",
            "whole number",
        ),
        ({"batch_tokens": True}, "batch_tokens is true: expected", "whole number"),
        ({"batch_tokens": None}, "batch_tokens is null: expected", "whole number"),
        (
            {"batch_tokens": 0},
            "batch_tokens is 0: expected a whole number of tokens >= max_length (128)",
            "whole number",
        ),
        ({"batch_tokens": 512.5}, "batch_tokens is 512.5: expected", "whole number"),
        ({"batch_tokens": 64}, "less than max_length 128", "batch_tokens >= 128"),
        ({"per_device_train_batch_size": 4}, "both batch_tokens and per_device_train_batch_size", "remove"),
        ({"packing": True}, "both batch_tokens and packing", "remove packing"),
        ({"train_sampling_strategy": "random"}, "both batch_tokens and train_sampling_strategy", "remove"),
    ],
)
def test_bad_values_are_refused_when_the_config_loads(chat_data, training, message, fix):
    with pytest.raises(LeapError) as err:
        load_config(_config(chat_data, "bad", **training))
    assert message in str(err.value) and fix in err.value.fix


def test_batch_tokens_belongs_to_sft(chat_data):
    config = tiny_config(training_type="dpo", training_config={"extends": "DEFAULT_DPO", "batch_tokens": 4096})
    with pytest.raises(LeapError, match="batch_tokens") as err:
        load_config(write_config(chat_data, config, "dpo.yaml"))
    assert "sft" in str(err.value) + err.value.fix


def test_the_resolved_config_records_no_row_count_or_sampler_beside_batch_tokens(chat_data):
    """The profile's per_device_train_batch_size and train_sampling_strategy are not used with batch_tokens: the
    run's resolved_config.yaml must not show them as the run's (validate refuses them beside batch_tokens)."""
    resolved = load_config(_config(chat_data, "record"))
    assert resolved.training["batch_tokens"] >= 128
    assert "per_device_train_batch_size" not in resolved.training
    assert "train_sampling_strategy" not in resolved.training
