"""The memory estimate against the measured peaks it was fitted to (memory/calibration.py MEASURED): every row,
predicted again from a config with the row's settings, within the tolerance."""

from __future__ import annotations

import pytest

from leap_finetune.memory.calibration import MEASURED, TOLERANCE
from leap_finetune.memory.estimate import GIB
from leap_finetune.memory.plan import training_process_memory
from leap_finetune.validate.loader import load_config
from tests.conftest import write_jsonl


def measured_config(row: dict, data) -> dict:
    """The config bench/memory.py ran for the row (its profile's defaults, rows that fill max_length)."""
    training = {"max_length": row["max_length"], "max_steps": 4, **row.get("settings", {})}
    if row["mode"] == "checkpointing":
        training["activation_checkpointing"] = True
    config = {
        "project_name": "memory",
        "model_name": f"LiquidAI/{row['model']}",
        "training_type": row["method"],
        "dataset": {"path": str(data)},
        "training_config": training,
    }
    if row["mode"] in (
        "lora",
        "qlora",
    ):  # (rows without their own lora_dropout ran 0.05, DEFAULT_LORA's until 2026-12-07)
        config["peft_config"] = {"extends": "DEFAULT_LORA", "lora_dropout": row.get("lora_dropout", 0.05)}
    return config


def measured_resolved(row: dict, folder):
    """The row's config as `plan` resolves it. QLoRA rows: DEFAULT_QLORA's nf4 base set on the resolved settings (what
    validate makes of `quantization: nf4`), since the suite keeps bitsandbytes out of its environment and validate
    refuses QLoRA without it (tests/config/test_quantization.py)."""
    from leap_finetune.config.quantization import QUANTIZATIONS

    rows = (
        [{"prompt": "Say it.", "chosen": "yes", "rejected": "no"}] * 4
        if row["method"] == "dpo"
        else [{"messages": [{"role": "user", "content": "Say it."}, {"role": "assistant", "content": "yes"}]}] * 4
    )
    write_jsonl(folder / f"{row['method']}.jsonl", rows)
    resolved = load_config(measured_config(row, folder / f"{row['method']}.jsonl"))
    if row["mode"] == "qlora":
        init = {"dtype": "bfloat16", "quantization_config": dict(QUANTIZATIONS["nf4"])}
        resolved = resolved.model_copy(update={"training": {**resolved.training, "model_init_kwargs": init}})
    return resolved


@pytest.mark.parametrize(
    "row",
    MEASURED,
    ids=lambda r: f"{r['model']}-{r['method']}-{r['mode']}-{r['max_length']}-{len(r.get('settings', {}))}",
)
def test_the_prediction_is_within_the_tolerance_of_the_measured_peak(row, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    memory = training_process_memory(measured_resolved(row, tmp_path))
    predicted = memory.peak / GIB
    assert abs(predicted - row["measured_gib"]) <= TOLERANCE * row["measured_gib"], (predicted, row)


def test_the_table_covers_the_sizes_and_modes_the_docs_show():
    seen = {(r["model"], r["mode"]) for r in MEASURED}
    for model in ("LFM2-350M", "LFM2-1.2B", "LFM2-2.6B"):
        assert {(model, "full"), (model, "lora"), (model, "qlora")} <= seen
