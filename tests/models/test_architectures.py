"""models/architectures.py is the one home of what each model type supports, and LFM2-MoE is one entry in it:
the modules that treat LFM2 specially ask it, LiquidAI's MoE names and shapes are known without a download, LoRA
says which layers it adapts (experts apart), and the MoE keys are checked at validate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from leap_finetune.models import architectures
from leap_finetune.models.architectures import ARCHITECTURES, peft_options
from tests.conftest import invoke, write_config

SRC = Path(__file__).resolve().parents[2] / "src" / "leap_finetune"


def test_no_module_keeps_its_own_list_of_lfm2_model_types():
    """A tuple or set of model-type strings anywhere but the table is a second home that drifts (issue #49 found
    eight, with different sets)."""
    pattern = re.compile(r"""[({\[]\s*["']lfm2(_moe|_vl)?["']\s*,\s*["']lfm2_(moe|vl)["']""")  # (not families)
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "architectures.py" and pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_each_capability_the_table_claims_is_what_the_modules_use():
    from leap_finetune.models import packed_conv
    from leap_finetune.models.registry import VARLEN_MODEL_TYPES

    assert set(packed_conv._PATCHED_MODULES) == {a.conv_module for a in ARCHITECTURES.values() if a.conv_module}
    assert VARLEN_MODEL_TYPES == {"lfm2", "lfm2_moe", "lfm2_vl"}
    assert architectures.supports("lfm2_moe", "decode_attention") and architectures.supports("lfm2_moe", "moe")
    assert not architectures.supports("llama", "flat_rows") and architectures.architecture(None) is None
    from leap_finetune.config.profiles import PEFT_PROFILES
    from leap_finetune.gguf_export.convert import TEXT_OF_VISION

    assert all(
        set(a.lora_targets) == set(PEFT_PROFILES["DEFAULT_LORA"]["target_modules"]) for a in ARCHITECTURES.values()
    )
    assert TEXT_OF_VISION["Lfm2VlForConditionalGeneration"] == architectures.LFM2_VL.gguf_text_architecture


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("LiquidAI/LFM2-8B-A1B", "lfm2_moe"),
        ("LiquidAI/LFM2.5-8B-A1B", "lfm2_moe"),
        ("LiquidAI/LFM2-24B-A2B", "lfm2_moe"),
        ("LiquidAI/LFM2-1.2B", "lfm2"),
        ("tiny-lfm2-moe", "lfm2_moe"),
    ],
)
def test_liquidais_moe_names_are_known_without_their_config(name, kind):
    from leap_finetune.models.registry import model_type

    assert model_type(name) == kind


def test_the_published_moe_shapes_build_to_the_model_cards_totals():
    from leap_finetune.memory.shapes import model_shape

    small, large = model_shape("LiquidAI/LFM2-8B-A1B"), model_shape("LiquidAI/LFM2-24B-A2B")
    assert (round(small.parameters / 1e9, 1), round(small.active_parameters / 1e9, 1)) == (8.3, 1.6)
    assert (round(large.parameters / 1e9), round(large.active_parameters / 1e9, 1)) == (24, 2.3)
    assert small.experts == 32 and small.experts_per_token == 4 and small.attention_layers == 6


def test_lora_experts_becomes_peft_target_parameters_only_on_a_model_with_experts():
    peft = {"r": 8, "target_modules": ["q_proj"], "lora_experts": True}
    assert peft_options(peft, "lfm2_moe")["target_parameters"] == list(architectures.EXPERT_PARAMETERS["lfm2_moe"])
    assert "target_parameters" not in peft_options(peft, "lfm2") and "lora_experts" not in peft_options(peft, "lfm2")


def _names(model_id: str) -> dict:
    from leap_finetune.models.structure import module_names
    from leap_finetune.models.tiny import load_tiny_tokenizer

    return module_names(model_id, load_tiny_tokenizer(model_id))


def test_lora_says_which_linear_layers_it_adapts_and_warns_when_fewer_than_half():
    from leap_finetune.models.structure import lora_coverage

    line, few = lora_coverage({"target_modules": ["q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2",
                                                   "w3"]}, _names("tiny-lfm2-moe"))  # fmt: skip
    assert line.startswith("LoRA adapts 15 of the model's 15 linear layers") and not few
    assert "the experts of 3 routed layers: not adapted (lora_experts: true adapts them)" in line
    # a LLaMA-style pattern (Axolotl's for LFM2-8B-A1B, by our reading) matches attention only
    llama = r".*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    line, few = lora_coverage({"target_modules": llama}, _names("tiny-lfm2"))
    assert few and "LoRA adapts 6 of the model's 24 linear layers (q_proj 2, k_proj 2, v_proj 2)" in line
    assert "not adapted: in_proj 2, out_proj 4" in line
    line, few = lora_coverage({"target_modules": "all-linear"}, _names("tiny-lfm2"))  # (peft's shorthand)
    assert line.startswith("LoRA adapts 24 of the model's 24 linear layers") and not few


def _config(workdir: Path, model: str, training: dict, peft: dict | None = None) -> Path:
    config = {
        "project_name": "moe-keys",
        "model_name": model,
        "training_type": "sft",
        "dataset": {"path": str(Path(__file__).resolve().parents[2] / "examples" / "data" / "quickstart.jsonl")},
        "training_config": training,
    }
    if peft is not None:
        config["peft_config"] = peft
    return write_config(workdir, config)


@pytest.mark.parametrize(
    ("training", "peft", "said"),
    [
        ({"router_aux_loss_coef": -0.1}, None, "router_aux_loss_coef is -0.1: expected a number >= 0"),
        ({"router_z_loss_coef": "lots"}, None, "router_z_loss_coef is 'lots': expected a number >= 0"),
        ({"router_aux_loss_coef": "1e6"}, None, "router_aux_loss_coef is 1000000.0: expected at most 1 - a weight"),
        ({}, {"lora_experts": "yes"}, "peft_config.lora_experts is 'yes': expected true or false"),
        ({}, {"lora_experts": True, "use_dora": True}, "use_dora is True with lora_experts: true"),
    ],
)
def test_bad_moe_keys_are_refused_at_validate(workdir, training, peft, said):
    result = invoke("validate", str(_config(workdir, "tiny-lfm2-moe", training, peft)))
    assert result.returncode == 2 and said in result.stderr


def test_moe_keys_on_a_dense_model_are_named_as_doing_nothing(workdir):
    config = _config(workdir, "tiny-lfm2", {"router_aux_loss_coef": "1e-3"}, {"lora_experts": True})
    result = invoke("validate", str(config))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stderr.split())
    assert "training_config.router_aux_loss_coef has no effect: tiny-lfm2 (model type lfm2) has no experts" in text
    assert "peft_config.lora_experts has no effect" in text
