"""The memory budget (memory/budget.py): parsing it, the defaults that change to fit it (in order, never a key the
user set), the refusal before any model loads, and `plan --json`'s memory per process."""

from __future__ import annotations

import json

import pytest

from leap_finetune.errors import LeapError
from leap_finetune.memory.budget import ALLOCATOR_SHARE, CONTEXT_BYTES, fit_to_budget, parse_budget
from leap_finetune.memory.estimate import GIB
from leap_finetune.memory.plan import training_process_memory
from leap_finetune.validate.loader import load_config
from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl


@pytest.mark.parametrize(
    ("text", "expected"),
    [("24GiB", 24 * GIB), ("80GB", 80 * 10**9), ("16", 16 * GIB), ("1.5 GiB", 3 * GIB // 2), ("1536MiB", 1536 * 2**20)],
)
def test_budgets_are_read_in_the_units_people_write(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("lots", "expected an amount of memory"),
        ("", "expected an amount of memory"),
        (True, "expected an amount of memory"),
        ("24 parsecs", "'parsecs' is not a unit leap-finetune reads: GiB, GB, MiB or MB"),
        ("1TiB", "'TiB' is not a unit"),
        ("-3GiB", "expected more than 0"),
        ("0", "expected more than 0"),
        ("1000000000.0", "more than any GPU holds"),
        ("24MB", "22.88 MiB is less than any GPU that trains holds .* did you mean 24GB"),
        ("512MiB", "512.00 MiB is less than any GPU .*at least 1 GiB - did you mean 512GiB"),
        ("0.5", "512.00 MiB is less than any GPU .*at least 1 GiB(?! - did you mean)"),
        (
            "0.5MiB",
            "0.50 MiB is less than any GPU .*at least 1 GiB(?! - did you mean)",
        ),  # (0.5GiB would be refused too: no hint)
        ("1023.9999MiB", "1,023.99 MiB is less than"),
    ],
)
def test_a_budget_that_is_not_one_gpus_memory_is_refused_saying_why(text, said):
    with pytest.raises(LeapError, match=said):
        parse_budget(text)


def _long_config(workdir, **training):
    """The tiny model on rows of max_length tokens, where activations matter (the batch left to the profile: 4)."""
    answer = " ".join(f"fact number {i} is true." for i in range(400))  # (longer than max_length: cut to it)
    turns = [{"role": "user", "content": "Tell me."}, {"role": "assistant", "content": answer}]
    write_jsonl(workdir / "train.jsonl", [{"messages": turns}] * 4 + fact_rows(12))
    config = tiny_config(training_config={"max_steps": 2})
    config["training_config"].pop("per_device_train_batch_size", None)
    config["training_config"].update({"max_length": 2048, **training})
    return config


def _with(resolved, **training):
    return training_process_memory(resolved.model_copy(update={"training": {**resolved.training, **training}}))


def _budget_between(low: float, high: float) -> int:
    """A budget whose usable part (CUDA's context and the allocator's slack kept aside) lies between two peaks."""
    return int(((low + high) / 2 + CONTEXT_BYTES) / (1 - ALLOCATOR_SHARE))


def test_a_budget_below_the_full_peak_takes_bf16_weights_then_a_smaller_micro_batch_and_says_so(workdir):
    """bf16 weights first (no speed lost), then the micro-batch halved while it still holds 4,096 tokens (a few
    percent), before activation checkpointing (10-30%, and with LoRA compile_layers off: 2.7x measured)."""
    resolved = load_config(_long_config(workdir))  # (4 rows of 2,048 tokens: 2 rows still hold 4,096)
    full = training_process_memory(resolved)
    halved = _with(resolved, optimizer_precision="bf16_kahan", per_device_train_batch_size=2)
    assert halved.peak < full.peak
    budget = _budget_between(full.peak, halved.peak)
    fitted = fit_to_budget(resolved, budget)
    assert [c.key for c in fitted.changes] == ["optimizer_precision", "per_device_train_batch_size"] and fitted.fits
    assert fitted.training["optimizer_precision"] == "bf16_kahan"
    assert fitted.training["per_device_train_batch_size"] == 2 and fitted.training["gradient_accumulation_steps"] == 2
    assert not fitted.training.get("activation_checkpointing")

    # plan for a GPU with that budget: the change, its reason and the memory per training process
    path = write_config(workdir, _long_config(workdir))
    result = invoke("plan", str(path), "--gpus", "1", "--json", "--gpu-memory", f"{budget / 2**20:.1f}MiB")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["memory_budget"]["fits"]
    assert report["memory_budget"]["changes"][-1]["key"] == "per_device_train_batch_size"
    [train] = [p for p in report["processes"] if p["name"] == "train"]
    assert set(train["memory"]) == {
        "peak_gib",
        "weights_gib",
        "gradients_gib",
        "optimizer_gib",
        "activations_gib",
        "other_gib",
        "cache_gib",
    }
    assert train["memory"]["peak_gib"] == pytest.approx(fitted.memory.peak / GIB, abs=0.01)
    text = invoke("plan", str(path), "--gpus", "1", "--gpu-memory", f"{budget / 2**20:.1f}MiB").stdout
    text = " ".join(text.split())
    assert "per_device_train_batch_size -> 2, gradient_accumulation_steps -> 2 (2 row(s) per micro-batch" in text


def test_checkpointing_makes_the_halved_micro_batches_unneeded_and_they_grow_back(workdir):
    """Halvings down to 4,096 tokens do not fit, checkpointing does: the micro-batch goes back to its 4 rows."""
    resolved = load_config(_long_config(workdir))
    bf16 = {"optimizer_precision": "bf16_kahan"}
    smallest_cheap = _with(resolved, **bf16, per_device_train_batch_size=2)
    checkpointed = _with(resolved, **bf16, activation_checkpointing=True)
    assert checkpointed.peak < smallest_cheap.peak
    fitted = fit_to_budget(resolved, _budget_between(checkpointed.peak, smallest_cheap.peak))
    assert [c.key for c in fitted.changes] == ["optimizer_precision", "activation_checkpointing"] and fitted.fits
    assert fitted.training["per_device_train_batch_size"] == 4 and fitted.training["activation_checkpointing"] is True
    assert fitted.changes[-1].peak == fitted.memory.peak == checkpointed.peak
    # each printed peak is that of its change applied in order, not one computed with a halving since undone
    assert fitted.changes[0].peak == _with(resolved, **bf16).peak


def test_the_cheap_halvings_count_a_preference_pair_twice():
    """DPO runs each row's chosen and rejected answers: its 4 rows of 1,024 tokens are 8,192 tokens, so the halving to
    2 rows (4,096) comes before checkpointing; SFT's 4 rows are 4,096 tokens: checkpointing before any halving."""
    from leap_finetune.memory.budget import _levers
    from leap_finetune.methods import METHODS

    training = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "max_length": 1024}

    def order(kind: str) -> list:
        levers = _levers(training, {"optimizer_precision"}, METHODS[kind], longest=1024)
        return [v["per_device_train_batch_size"] if isinstance(v, dict) else k for k, v, _ in levers]

    assert order("dpo")[:3] == [2, "activation_checkpointing", 1]
    assert order("sft")[:3] == ["activation_checkpointing", 2, 1]


def test_smaller_micro_batches_keep_the_global_batch(workdir):
    resolved = load_config(_long_config(workdir, activation_checkpointing=True))
    one_row = fit_to_budget(resolved, 1)  # (nothing fits: every lever tried, in order)
    rows = [c.value for c in one_row.changes if c.key == "per_device_train_batch_size"]
    assert rows == [
        {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2},
        {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4},
    ]
    assert not one_row.fits


def test_keys_the_user_set_are_never_changed(workdir):
    config = _long_config(
        workdir, activation_checkpointing=False, per_device_train_batch_size=4, optimizer_precision="fp32"
    )
    fitted = fit_to_budget(load_config(config), 1)
    assert fitted.changes == [] and not fitted.fits
    assert fitted.training["activation_checkpointing"] is False and fitted.training["per_device_train_batch_size"] == 4
    assert fitted.training["optimizer_precision"] == "fp32"


def test_lora_takes_a_bf16_frozen_base_first(workdir):
    config = {**_long_config(workdir), "peft_config": {"extends": "DEFAULT_LORA"}}
    fitted = fit_to_budget(load_config(config), 1)
    assert fitted.changes[0].key == "model_init_kwargs" and fitted.changes[0].reason.startswith("the frozen base")
    assert fitted.training["model_init_kwargs"] == {"dtype": "bfloat16"}
    assert "optimizer_precision" not in fitted.training  # (refused with LoRA: config/precision.py)


def test_lora_dropout_is_off_by_default_and_counted_where_the_user_sets_it(workdir):
    """DEFAULT_LORA's dropout is 0 (measured: 0.05 cost LFM2-1.2B 2.9 GiB and 7% of its tokens/s); a user's 0.05 adds a
    dropped copy of each adapted layer's input to the prediction (FIT.lora_dropout_layer_bytes)."""
    from leap_finetune.memory.calibration import FIT
    from leap_finetune.memory.plan import setup_of, shape_of

    default = load_config({**_long_config(workdir), "peft_config": {"extends": "DEFAULT_LORA"}})
    dropped = load_config({**_long_config(workdir), "peft_config": {"extends": "DEFAULT_LORA", "lora_dropout": 0.05}})
    assert default.peft["lora_dropout"] == 0.0 and dropped.peft["lora_dropout"] == 0.05
    shape = shape_of(default)
    setup = setup_of(dropped, shape)
    assert not setup_of(default, shape).lora_dropout and setup.lora_dropout
    added = training_process_memory(dropped, None).activations - training_process_memory(default, None).activations
    assert added == pytest.approx(FIT.lora_dropout_layer_bytes * shape.hidden * shape.layers * setup.tokens, rel=1e-6)


def test_a_4_bit_base_is_predicted_at_a_quarter_of_the_bf16_weights(workdir):
    """QLoRA's prediction (no bitsandbytes needed to plan): the linear layers at NF4's ~0.52 bytes a weight."""
    from leap_finetune.config.quantization import QUANTIZATIONS
    from leap_finetune.memory.plan import setup_of, shape_of

    lora = load_config({**_long_config(workdir), "peft_config": {"extends": "DEFAULT_LORA"}})
    lora = lora.model_copy(update={"training": {**lora.training, "model_init_kwargs": {"dtype": "bfloat16"}}})
    init = {"dtype": "bfloat16", "quantization_config": dict(QUANTIZATIONS["nf4"])}
    qlora = lora.model_copy(update={"training": {**lora.training, "model_init_kwargs": init}})
    bf16, nf4 = (training_process_memory(r, None) for r in (lora, qlora))
    shape = shape_of(lora)
    linear = sum(i * o for i, o in shape.linear.values())
    assert setup_of(qlora, shape).weight_bytes < 0.53
    assert bf16.weights - nf4.weights == pytest.approx(linear * (2 - setup_of(qlora, shape).weight_bytes), rel=0.01)
    assert nf4.activations == bf16.activations and nf4.optimizer == bf16.optimizer


def test_an_impossible_budget_is_exit_2_before_any_model_loads_and_names_lora(workdir):
    path = write_config(workdir, _long_config(workdir))
    result = invoke("validate", str(path), "--gpu-memory", "1GiB")
    assert result.returncode == 2
    text = " ".join(result.stderr.split())
    assert "GiB a 1.0 GiB budget leaves for it (CUDA's context and the allocator's slack kept aside)" in text
    assert "LoRA (peft_config: {extends: DEFAULT_LORA}) is predicted at" in text
    assert "QLoRA (peft_config: {extends: DEFAULT_QLORA}) is predicted at" in text
    assert "gpu_memory" in text and "Traceback" not in result.stderr
    # gpu_memory: in the YAML is the same budget; --gpu-memory wins over it
    config = {**_long_config(workdir), "gpu_memory": "1GiB"}
    assert invoke("validate", str(write_config(workdir, config, "yaml_budget.yaml"))).returncode == 2
    assert invoke("validate", str(path), "--gpu-memory", "80GiB").returncode == 0
    # both on the command line: refused, not one silently winning over the other
    both = invoke("validate", str(path), "--gpu-memory", "80GiB", "--set", "gpu_memory=1GiB")
    assert both.returncode == 2 and "--gpu-memory and --set gpu_memory=... both give" in both.stderr, both.stderr
    # an empty --gpu-memory is refused as --set gpu_memory= is (it was dropped: a run planned for no budget)
    empty = invoke("validate", str(path), "--gpu-memory", "")
    assert empty.returncode == 2 and "gpu_memory is '': expected an amount of memory" in empty.stderr, empty.stderr
    # plan's refusal names the same choices, each predicted from the config as written (not with the fitting's
    # bf16_kahan, which LoRA refuses and which would price QLoRA's 4-bit base as bf16): QLoRA below LoRA
    big = ("--set", "model_name=LiquidAI/LFM2-350M")  # (its published shape: the tiny model's GiB round to 0.0)
    plan = json.loads(invoke("plan", str(path), "--gpus", "1", "--json", "--gpu-memory", "1GiB", *big).stdout)
    refusal = plan["memory_budget"]["refusal"]
    import re

    lora, qlora = (
        float(x)
        for x in re.findall(r"LoRA \(peft_config: \{extends: DEFAULT_Q?LORA}\) is predicted at ([\d.]+)", refusal)
    )
    assert qlora < lora, refusal


def test_a_misspelt_budget_in_the_yaml_names_the_key(workdir):
    config = {**_long_config(workdir), "gpu_memory": "lots"}
    result = invoke("validate", str(write_config(workdir, config)))
    assert result.returncode == 2 and "gpu_memory is 'lots': expected an amount of memory" in " ".join(
        result.stderr.split()
    )


def test_the_run_report_and_the_card_put_the_measured_peak_beside_the_prediction():
    """What a GPU run's summary carries (recipes/summary.py: torch.cuda.max_memory_allocated, and the prediction
    fit_run made): the report's and the model card's row."""
    from leap_finetune.recipes.summary import gpu_memory_text

    text = gpu_memory_text({"peak_gpu_memory_gib": 18.53, "predicted_gpu_memory_gib": 18.5})
    assert text == "18.5 GiB peak per training process (predicted 18.5 GiB)"
    assert gpu_memory_text({"peak_gpu_memory_gib": 7.56}) == "7.6 GiB peak per training process"


def test_validate_on_a_gpu_plan_records_the_prediction_a_cpu_run_has_none(workdir):
    from rich.console import Console

    from leap_finetune.memory.budget import fit_run

    resolved = load_config(_long_config(workdir))
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115
    assert fit_run(resolved, None, None, quiet).predicted_gpu_memory is None  # (CPU: no GPU memory)
    planned = fit_run(resolved.model_copy(update={"gpu_memory": 80 * GIB}), None, None, quiet, planning=True)
    assert planned.predicted_gpu_memory == pytest.approx(training_process_memory(resolved).peak)
    resumed = fit_run(resolved.model_copy(update={"gpu_memory": 1}), "0", None, quiet, resuming=True)
    assert resumed.training == resolved.training and resumed.predicted_gpu_memory is not None  # (never refits)


def test_a_cuda_out_of_memory_error_becomes_the_settings_to_change_and_the_planner(tmp_path):
    """The handler around training (recipes/failures.py) turns torch's OutOfMemoryError into what to change."""
    import torch

    from leap_finetune.recipes.failures import disk_errors

    training = {"per_device_train_batch_size": 8, "max_length": 2048}
    with pytest.raises(LeapError) as caught, disk_errors(tmp_path, None, training):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    text = f"{caught.value.message} {caught.value.fix}"
    assert "out of GPU memory (per_device_train_batch_size 8, max_length 2048" in text
    assert "--gpu-memory N" in text and "docs/memory.md" in text and "run again" in text


def test_kto_keeps_two_rows_per_micro_batch_and_grpo_keeps_its_batch(workdir):
    """KTO's KL estimate pairs rows of a micro-batch; GRPO's batch is its completions: the planner leaves them."""
    write_jsonl(
        workdir / "kto.jsonl", [{"prompt": "Say it.", "completion": "yes", "label": i % 2 == 0} for i in range(8)]
    )
    kto = load_config({**tiny_config("kto.jsonl", training_type="kto"), "training_config": {"max_length": 2048}})
    rows = [c.value["per_device_train_batch_size"] for c in fit_to_budget(kto, 1).changes if c.key.startswith("per")]
    assert rows and min(rows) == 2
    from leap_finetune.memory.budget import _levers
    from leap_finetune.methods import method_of

    grpo = [key for key, _, _ in _levers({"per_device_train_batch_size": 16}, set(), method_of("grpo"))]
    assert "per_device_train_batch_size" not in grpo and "activation_checkpointing" in grpo


def test_lfm2_vl_parts_trained_beside_lora_keep_float32_weights():
    from leap_finetune.memory.budget import _free_levers

    assert not list(_free_levers({"train_vision_encoder": True}, set(), lora=True))
    assert not list(_free_levers({"train_projector": True}, set(), lora=True))
    assert [key for key, _, _ in _free_levers({}, set(), lora=True)] == ["model_init_kwargs"]


def test_lora_takes_the_bf16_base_on_any_gpu_even_where_the_float32_one_fits(workdir):
    """The frozen base in bf16 costs neither speed nor accuracy: taken at 80 GiB too, said, and never over a dtype
    the user wrote; a full fine-tune that fits keeps its float32 master weights."""
    lora = load_config({**_long_config(workdir), "peft_config": {"extends": "DEFAULT_LORA"}})
    fitted = fit_to_budget(lora, 80 * GIB)
    assert [c.key for c in fitted.changes] == ["model_init_kwargs"] and fitted.fits
    assert fitted.training["model_init_kwargs"]["dtype"] == "bfloat16"
    assert fitted.memory.peak < training_process_memory(lora).peak
    own = load_config(
        {
            **_long_config(workdir, model_init_kwargs={"dtype": "float32"}),
            "peft_config": {"extends": "DEFAULT_LORA"},
        }
    )
    assert fit_to_budget(own, 80 * GIB).changes == []
    assert fit_to_budget(load_config(_long_config(workdir)), 80 * GIB).changes == []


def test_grpo_and_the_encoders_get_no_optimizer_precision_and_encoders_no_prediction(workdir):
    """optimizer_precision is SFT's, DPO's and KTO's key (GRPO's and sentence-transformers' arguments refuse it);
    the retrieval encoders have no measured constants yet: no prediction, so no fitting and no refusal."""
    from leap_finetune.memory.budget import _levers
    from leap_finetune.methods import method_of

    grpo = [key for key, _, _ in _levers({}, set(), method_of("grpo"))]
    assert "optimizer_precision" not in grpo
    write_jsonl(workdir / "pairs.jsonl", [{"anchor": f"q{i}", "positive": f"d{i}"} for i in range(8)])
    embedding = load_config({**tiny_config("pairs.jsonl", training_type="embedding"), "training_config": {}})
    assert training_process_memory(embedding) is None and fit_to_budget(embedding, 1) is None


def test_a_config_transformers_cannot_build_is_no_prediction_not_a_crash(tmp_path):
    from leap_finetune.memory.shapes import model_shape

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 64}))
    assert model_shape(str(tmp_path)) is None
    assert model_shape("someorg/not-cached-anywhere") is None


def test_a_resume_keeps_the_settings_the_memory_fit_chose_unless_the_config_now_sets_them(workdir, monkeypatch):
    from leap_finetune.launch import checks, plan

    recorded = {"fitted_training": {"activation_checkpointing": True, "optimizer_precision": "bf16_kahan"}}
    monkeypatch.setattr(plan, "resumed_config", lambda run_plan: (recorded, None))
    run_plan = plan.RunPlan(workdir, "run", None, new_run=False)
    resolved = load_config(_long_config(workdir, optimizer_precision="fp32"))
    kept = checks._memory_fit_of_the_run(resolved, run_plan)
    assert kept.training["activation_checkpointing"] is True  # (the fit's choice, kept)
    assert kept.training["optimizer_precision"] == "fp32"  # (the config sets it now: its value)
    assert kept.fitted_training == {"activation_checkpointing": True}
    assert checks._memory_fit_of_the_run(resolved, plan.RunPlan(workdir, "run", None, new_run=True)) is resolved


def test_a_budget_on_a_cpu_run_is_said_to_have_no_effect(workdir):
    from rich.console import Console

    from leap_finetune.memory.budget import fit_run

    console = Console(record=True, width=200, file=open("/dev/null", "w"))  # noqa: SIM115
    resolved = load_config({**_long_config(workdir), "gpu_memory": "24GiB"})
    assert fit_run(resolved, None, None, console).training == resolved.training
    assert "note: gpu_memory is not used: this run trains on the CPU" in console.export_text()
