"""QLoRA's configuration (config/quantization.py, validate/peft.py): the profile and the short names become a
quantization_config for from_pretrained; what cannot work is refused before a model loads. (The runs themselves, with
bitsandbytes installed: tests/e2e/test_qlora.py.)"""

from __future__ import annotations

import importlib.util

import pytest

from leap_finetune.config.quantization import (
    QUANTIZATIONS,
    VISION_SKIPS,
    add_quantization,
    check_quantized_run,
    lora_name,
)
from leap_finetune.errors import LeapError
from leap_finetune.validate.peft import resolve_peft
from tests.conftest import fact_rows, invoke, tiny_config, write_config, write_jsonl


def test_default_qlora_is_default_lora_over_an_nf4_base():
    lora, none = resolve_peft({"extends": "DEFAULT_LORA"}, "config")
    qlora, quantization = resolve_peft({"extends": "DEFAULT_QLORA"}, "config")
    assert none is None and qlora == lora and "quantization" not in qlora  # (not a LoRA option: peft would refuse it)
    assert quantization == {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    }


@pytest.mark.parametrize(("name", "key"), [("int8", "load_in_8bit"), ("fp4", "load_in_4bit")])
def test_the_short_names_choose_the_base_quantization(name, key):
    _, quantization = resolve_peft({"quantization": name}, "config")
    assert quantization[key] is True
    _, none = resolve_peft({"extends": "DEFAULT_QLORA", "quantization": "none"}, "config")
    assert none is None  # (plain LoRA on top of the profile)


def test_a_misspelt_quantization_names_the_key_and_the_choices():
    with pytest.raises(LeapError) as caught:
        resolve_peft({"quantization": "nf5"}, "config.yaml")
    assert "peft_config.quantization is 'nf5'" in caught.value.message
    assert "nf4" in caught.value.fix and "int8" in caught.value.fix


def test_a_quantized_base_with_a_full_fine_tune_is_refused():
    with pytest.raises(LeapError, match="use_peft: false"):
        resolve_peft({"extends": "DEFAULT_QLORA", "use_peft": False}, "config")


def test_the_quantization_set_twice_is_refused_naming_both():
    kwargs = {"quantization_config": {"load_in_8bit": True}}
    with pytest.raises(LeapError) as caught:
        add_quantization(kwargs, dict(QUANTIZATIONS["nf4"]), vision=False, where="config")
    assert "peft_config" in caught.value.message and "model_init_kwargs.quantization_config" in caught.value.message


def test_a_quantized_base_keeps_its_other_weights_in_bf16_unless_dtype_is_given():
    assert add_quantization({}, dict(QUANTIZATIONS["nf4"]), vision=False, where="c")["dtype"] == "bfloat16"
    kept = add_quantization({"dtype": "float32"}, dict(QUANTIZATIONS["nf4"]), vision=False, where="c")
    assert kept["dtype"] == "float32"
    assert add_quantization({"dtype": "float32"}, None, vision=False, where="c") == {"dtype": "float32"}


def test_a_vision_language_base_quantizes_the_language_model_only():
    kwargs = add_quantization({}, dict(QUANTIZATIONS["nf4"]), vision=True, where="c")
    assert kwargs["quantization_config"]["llm_int8_skip_modules"] == VISION_SKIPS
    from transformers.quantizers.quantizers_utils import should_convert_module

    # (transformers' own matching of the skip list: the vision tower, the projector and lm_head stay unquantized)
    for name in ("model.vision_tower.encoder.layers.0.self_attn.q_proj", "model.multi_modal_projector.linear_1"):
        assert not should_convert_module(name, VISION_SKIPS)
    assert not should_convert_module("lm_head", VISION_SKIPS)
    assert should_convert_module("model.language_model.layers.0.self_attn.q_proj", VISION_SKIPS)


def test_what_a_quantized_base_cannot_do_is_said_before_a_model_loads():
    quantized = {"model_init_kwargs": {"quantization_config": dict(QUANTIZATIONS["nf4"])}}
    with pytest.raises(LeapError, match="sentence encoder"):
        check_quantized_run(dict(quantized), "embedding", set(), "c")
    grpo = {**quantized, "use_vllm": True}
    check_quantized_run(grpo, "grpo", set(), "c")  # DEFAULT_GRPO's vLLM: the own sampler instead
    assert grpo["use_vllm"] is False
    with pytest.raises(LeapError, match="use_vllm: false"):
        check_quantized_run({**quantized, "use_vllm": True}, "grpo", {"use_vllm"}, "c")  # the user's own choice


def test_reports_call_it_qlora():
    assert lora_name({"model_init_kwargs": {"quantization_config": dict(QUANTIZATIONS["nf4"])}}) == "QLoRA (nf4)"
    assert lora_name({"model_init_kwargs": {"quantization_config": {"load_in_8bit": True}}}) == "QLoRA (int8)"
    assert lora_name({}) == "LoRA"


def test_without_bitsandbytes_validate_gives_the_install_line(workdir):
    # (the suite keeps bitsandbytes out of .venv itself: scripts/setup.sh installs it in .venv/qlora)
    assert importlib.util.find_spec("bitsandbytes") is None
    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    config = tiny_config(peft_config={"extends": "DEFAULT_QLORA"})
    result = invoke("validate", str(write_config(workdir, config)))
    text = " ".join(result.stderr.split())
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "peft_config.quantization needs bitsandbytes, which is not installed here" in text
    assert "pip install 'leap-finetune[qlora]'" in text
