"""What leap-finetune does for each model architecture (config.json's `model_type`), in one place.

Every module that treats LFM2 specially asks this table instead of keeping its own list of model types: exact
packing (flat rows through models/flat_rows.py, the boundary-aware convolution of models/packed_conv.py),
varlen attention, the rollout sampler's decode attention, the config keys vLLM reads (models/lfm2_keys.py), the
GGUF converter's architecture, LoRA's default targets, whether the model routes tokens to experts. A new
architecture is one entry here (and the tests that hold each capability to its claim: tests/models/).

No torch import: the planner and `validate` read it before any library loads.
"""

from __future__ import annotations

from dataclasses import dataclass

# LoRA's default targets on LFM2's text layers: attention (q/k/v/out_proj), short convolution (in_proj/out_proj),
# the SwiGLU MLP (w1/w2/w3). On LFM2-MoE these are the same names: the dense MLPs of its first layers are w1/w2/w3,
# and its experts are 3-D parameters that no module name matches (architectures.EXPERT_PARAMETERS, lora_experts).
LFM2_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3")


@dataclass(frozen=True)
class Architecture:
    model_type: str
    text_model_type: str  # the language model's own (LFM2-VL's is an LFM2)
    flat_rows: bool  # padding-free and packed batches through models/flat_rows.py (tested: packed = unpacked)
    varlen_attention: bool  # models/varlen_attention.py's padding-free attention (its language model's)
    conv_module: str | None  # transformers' modeling module whose causal_conv1d_fn packed_conv replaces
    decode_attention: bool  # rl/sampler.py's one-token attention reproduces the model's (tested against SDPA)
    original_keys: bool  # models/lfm2_keys.py: the original LFM2 config keys vLLM reads
    gguf_text_architecture: str | None  # llama.cpp's converter class for the language model
    lora_targets: tuple[str, ...] = ()  # DEFAULT_LORA's target_modules cover these (tests/models/test_architectures)
    moe: bool = False  # tokens routed to experts (router metrics, aux loss, expert LoRA)
    vision: bool = False
    continuous_batching: bool = False  # transformers' paged cache keeps the model's state (LFM2's conv: no)


LFM2 = Architecture(
    model_type="lfm2",
    text_model_type="lfm2",
    flat_rows=True,
    varlen_attention=True,
    conv_module="transformers.models.lfm2.modeling_lfm2",
    decode_attention=True,
    original_keys=True,
    gguf_text_architecture="Lfm2ForCausalLM",
    lora_targets=LFM2_LORA_TARGETS,
)
LFM2_MOE = Architecture(
    model_type="lfm2_moe",
    text_model_type="lfm2_moe",
    flat_rows=True,
    varlen_attention=True,
    conv_module="transformers.models.lfm2_moe.modeling_lfm2_moe",
    decode_attention=True,
    original_keys=True,
    gguf_text_architecture="Lfm2MoeForCausalLM",
    lora_targets=LFM2_LORA_TARGETS,
    moe=True,
)
LFM2_VL = Architecture(
    model_type="lfm2_vl",
    text_model_type="lfm2",
    flat_rows=False,  # (image rows: the collator pads; its language model's attention is varlen)
    varlen_attention=True,
    conv_module=None,  # (its language model's module is LFM2's, above)
    decode_attention=False,
    original_keys=True,
    gguf_text_architecture="Lfm2ForCausalLM",
    lora_targets=LFM2_LORA_TARGETS,  # (its language model's: DEFAULT_VLM_LORA)
    vision=True,
)
ARCHITECTURES = {a.model_type: a for a in (LFM2, LFM2_MOE, LFM2_VL)}
LFM2_TEXT_TYPES = frozenset(a.model_type for a in ARCHITECTURES.values() if not a.vision)  # LFM2 language models

# LFM2-MoE's experts: 3-D parameters (experts x out x in) that peft adapts with `target_parameters`
# (lora_experts: true), never through target_modules (no nn.Linear holds them).
EXPERT_PARAMETERS = {"lfm2_moe": ("feed_forward.experts.gate_up_proj", "feed_forward.experts.down_proj")}


def architecture(model_type: str | None) -> Architecture | None:
    """The entry for a model type; None for an architecture leap-finetune has no special path for (it trains
    through transformers' and TRL's generic code)."""
    return ARCHITECTURES.get(model_type or "")


def supports(model_type: str | None, capability: str) -> bool:
    """Whether the architecture has `capability` (a field of Architecture that is true); False when unknown."""
    found = architecture(model_type)
    return bool(found is not None and getattr(found, capability))


def conv_modules() -> tuple[str, ...]:
    return tuple(a.conv_module for a in ARCHITECTURES.values() if a.conv_module)


def peft_options(peft: dict, model_type: str | None) -> dict:
    """The resolved peft_config as peft's LoraConfig options: `lora_experts: true` (leap-finetune's key) becomes
    peft's `target_parameters` naming the model's expert weights (EXPERT_PARAMETERS: 3-D parameters, one adapter
    pair per expert), added to what target_modules adapts."""
    options = {k: v for k, v in peft.items() if k != "lora_experts"}
    if peft.get("lora_experts") and model_type in EXPERT_PARAMETERS:
        options["target_parameters"] = list(
            dict.fromkeys([*(options.get("target_parameters") or []), *EXPERT_PARAMETERS[model_type]])
        )
    return options
