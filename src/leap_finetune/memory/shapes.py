"""The shape of the model a run trains, from its config alone: no weight is read or allocated.

The model is built on torch's `meta` device from its config (a local folder's config.json, the Hugging Face cache,
the built-in tiny models, or - for LiquidAI's published models when neither holds it - the architectures in
`PUBLISHED` below: `plan` never downloads), so the parameter counts and the layers LoRA wraps are exact for any
architecture transformers builds. memory/estimate.py reads only this.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

_LFM2 = {"model_type": "lfm2", "vocab_size": 65536, "num_key_value_heads": 8, "conv_L_cache": 3}
_SIX = [2, 5, 8, 10, 12, 14]  # (the attention layers of the 16-layer models)
# LiquidAI's published LFM2 architectures (their config.json's shape keys); the parameter counts they build to match
# the model cards: 354M, 742M, 1.17B, 2.57B (tests/memory/test_shapes.py)
_TEXT = {
    "350M": {**_LFM2, "hidden_size": 1024, "intermediate_size": 6656, "num_hidden_layers": 16,
             "num_attention_heads": 16, "full_attn_idxs": _SIX},
    "700M": {**_LFM2, "hidden_size": 1536, "intermediate_size": 10240, "num_hidden_layers": 16,
             "num_attention_heads": 24, "full_attn_idxs": _SIX},
    "1.2B": {**_LFM2, "hidden_size": 2048, "intermediate_size": 12288, "num_hidden_layers": 16,
             "num_attention_heads": 32, "full_attn_idxs": _SIX},
    "2.6B": {**_LFM2, "hidden_size": 2048, "intermediate_size": 10752, "num_hidden_layers": 30,
             "num_attention_heads": 32, "block_auto_adjust_ff_dim": False,
             "full_attn_idxs": [2, 6, 10, 14, 18, 21, 24, 27]},
}  # fmt: skip
# LiquidAI's mixture-of-experts models (LFM2-8B-A1B, LFM2.5-8B-A1B; LFM2-24B-A2B): the model cards' shapes (8B: 24
# layers, 18 conv + 6 attention, 32 experts, 4 per token, the first 2 layers dense; 24B: 40 layers, 30 + 10, 64
# experts, 4 per token, expert width 1536). The attention layers' positions are not on the cards (spread here as in
# the dense models): they change no count. Built, they match the cards' totals: 8.3B / 1.5B active, 24B / 2.3B.
_MOE = {
    **_LFM2,
    "model_type": "lfm2_moe",
    "hidden_size": 2048,
    "intermediate_size": 7168,
    "num_attention_heads": 32,
    "num_dense_layers": 2,
    "num_experts_per_tok": 4,
    "use_expert_bias": True,
    "norm_topk_prob": True,
}
_MOE_TEXT = {
    ("8B", "A1B"): {
        **_MOE,
        "num_hidden_layers": 24,
        "num_experts": 32,
        "moe_intermediate_size": 1792,
        "full_attn_idxs": [2, 6, 10, 14, 18, 21],
    },
    ("24B", "A2B"): {
        **_MOE,
        "num_hidden_layers": 40,
        "num_experts": 64,
        "moe_intermediate_size": 1536,
        "full_attn_idxs": [2, 6, 10, 14, 18, 22, 26, 30, 34, 37],
    },
}
_SIGLIP2 = {"model_type": "siglip2_vision_model", "patch_size": 16, "num_patches": 256, "vision_use_head": False}
_VISION = {
    "450M": {**_SIGLIP2, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
             "num_attention_heads": 12},
    "1.6B": {**_SIGLIP2, "hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 26,
             "num_attention_heads": 16},
}  # fmt: skip


def published(model_id: str) -> dict | None:
    """The config dict of a LiquidAI model by its name (any fine-tune's suffix: -Instruct, -Extract, ...)."""
    import re

    name = model_id.rsplit("/", 1)[-1]
    moe = re.match(r"LFM2(\.5)?-(\d+B)-(A\d+B)", name, re.IGNORECASE)
    if moe:
        found = _MOE_TEXT.get((moe.group(2).upper(), moe.group(3).upper()))
        return _moe_config(found) if found else None
    found = re.match(r"LFM2(\.5)?-(VL-)?(\d+(?:\.\d+)?[MB])", name, re.IGNORECASE)
    if not found:
        return None
    size, vision = found.group(3).upper(), bool(found.group(2))
    if vision:
        text = {"450M": "350M", "1.6B": "1.2B"}.get(size)
        if text is None or size not in _VISION:
            return None
        return {
            "model_type": "lfm2_vl",
            "text_config": _TEXT[text],
            "vision_config": _VISION[size],
            "downsample_factor": 2,
            "projector_hidden_size": 2560,
        }
    return dict(_TEXT[size]) if size in _TEXT else None


def _moe_config(known: dict) -> dict:
    """transformers' Lfm2MoeConfig reads `layer_types`, not the original `full_attn_idxs`."""
    config = {k: v for k, v in known.items() if k != "full_attn_idxs"}
    attention = set(known["full_attn_idxs"])
    config["layer_types"] = ["full_attention" if i in attention else "conv" for i in range(known["num_hidden_layers"])]
    return config


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate needs of a model: parameter counts, the language model's dimensions and the vision
    encoder's."""

    source: str  # where the config came from (said by plan)
    parameters: int  # every weight
    vision_parameters: int  # the vision encoder and projector (0 for a text model)
    embedding_parameters: int  # the input embedding (and a tied output head)
    hidden: int
    intermediate: int
    layers: int
    attention_layers: int
    kv_width: int  # key/value heads x head size: one token's keys (and values) in one attention layer
    conv_width: int  # a convolution layer's state per row (hidden x cache length)
    vocab: int
    linear: dict  # module name -> (in, out) of every Linear layer (what LoRA may wrap, what 4-bit quantizes)
    expert_parameters: int = 0  # a mixture of experts: the routed experts' weights (all of them)
    experts: int = 0
    experts_per_token: int = 0
    vision_layers: int = 0  # a vision-language model's vision encoder (SigLIP2): its layers and hidden size
    vision_hidden: int = 0

    @property
    def active_parameters(self) -> int:
        """The weights one token runs through: all but the experts it is not routed to."""
        if not self.experts:
            return self.parameters
        return (
            self.parameters - self.expert_parameters + self.expert_parameters * self.experts_per_token // self.experts
        )

    def lora_parameters(self, peft: dict) -> int:
        """The adapter weights LoRA adds for `peft` (its r and target_modules), matched as peft matches them."""
        rank, wrapped = int(peft.get("r", 8)), self.lora_targets(peft)
        return sum(rank * (i + o) for name, (i, o) in self.linear.items() if name in wrapped)

    def lora_targets(self, peft: dict) -> set[str]:
        """The Linear layers `peft` wraps."""
        from peft import LoraConfig
        from peft.tuners.tuners_utils import check_target_module_exists

        options = {k: v for k, v in peft.items() if k in ("target_modules", "r", "exclude_modules")}
        config = LoraConfig(**options)
        return {name for name in self.linear if check_target_module_exists(config, name)}


def model_shape(model_id: str) -> ModelShape | None:
    """The shape of `model_id`, or None when its config is nowhere at hand (plan says so)."""
    from leap_finetune.models.tiny import TINY_MODELS

    if model_id in TINY_MODELS:
        return _remembered(None, "built-in", model_id)
    try:  # (a config transformers cannot build as a causal LM, or custom code: no prediction, never a crash)
        config, source = _config(model_id)
        return _remembered(config, source, model_id) if config is not None else None
    except Exception:  # noqa: BLE001
        return None


def _remembered(config, source: str, model_id: str) -> ModelShape:
    """The shape measured once per config (memo.py: under the libraries' versions and our code): measuring builds the
    model on the meta device, which imports torch and the model's transformers code - ~3 s of every `plan` and
    `validate` on a GPU machine, where the memory plan runs (measured with `plan --gpus 1`: 3.8 s against 0.9 s)."""
    from dataclasses import asdict

    from leap_finetune.memo import remembered

    try:
        question = [model_id, source, config.to_json_string(use_diff=False) if config is not None else None]
    except (TypeError, ValueError):  # (a value JSON cannot hold: measured each time, as before the memo)
        return _measure(config, source, model_id)
    found = remembered("model-shape", question, lambda: _json_ready(asdict(_measure(config, source, model_id))))
    return ModelShape(**{**found, "linear": {name: tuple(size) for name, size in found["linear"].items()}})


def _json_ready(shape: dict) -> dict:
    return {**shape, "linear": {name: list(size) for name, size in shape["linear"].items()}}


def _config(model_id: str):
    from transformers import AutoConfig

    if Path(model_id).is_dir():
        return AutoConfig.from_pretrained(model_id, trust_remote_code=False), "the model folder's config.json"
    try:
        cached = AutoConfig.from_pretrained(model_id, local_files_only=True, trust_remote_code=False)
        return cached, "config.json in the Hugging Face cache"
    except (OSError, ValueError):
        pass
    known = published(model_id)
    if known is None:
        return None, None
    known = dict(known)
    return AutoConfig.for_model(known.pop("model_type"), **known), "LiquidAI's published architecture"


def _meta_model(config, model_id: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from leap_finetune.models.tiny import TINY_MODELS, build_tiny_model, load_tiny_tokenizer

    with torch.device("meta"):
        if model_id in TINY_MODELS:
            return build_tiny_model(model_id, load_tiny_tokenizer(model_id))
        vision = hasattr(config, "vision_config")
        return (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_config(config)


def _measure(config, source: str, model_id: str) -> ModelShape:
    import torch

    model = _meta_model(config, model_id)
    text = model.config.get_text_config()
    vision = sum(p.numel() for n, p in model.named_parameters() if "vision_tower" in n or "multi_modal_projector" in n)
    seeing = getattr(model.config, "vision_config", None)
    layer_types = list(getattr(text, "layer_types", None) or [])
    attention = sum(t == "full_attention" for t in layer_types) or text.num_hidden_layers
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    linear = {
        name: (m.in_features, m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head")
    }
    return ModelShape(
        source=source,
        parameters=sum(p.numel() for p in model.parameters()),
        vision_parameters=vision,
        embedding_parameters=model.get_input_embeddings().weight.numel(),
        hidden=text.hidden_size,
        intermediate=_intermediate(model, text),
        layers=text.num_hidden_layers,
        attention_layers=attention,
        kv_width=getattr(text, "num_key_value_heads", heads) * head_dim,
        conv_width=text.hidden_size * int(getattr(text, "conv_L_cache", 0) or 0) * 3,
        vocab=text.vocab_size,
        linear=linear,
        expert_parameters=sum(p.numel() for n, p in model.named_parameters() if ".experts." in n),
        experts=int(getattr(text, "num_experts", 0) or 0),
        experts_per_token=int(getattr(text, "num_experts_per_tok", 0) or 0),
        vision_layers=int(seeing.num_hidden_layers) if seeing is not None else 0,
        vision_hidden=int(seeing.hidden_size) if seeing is not None else 0,
    )


def _intermediate(model, text) -> int:
    """The MLP's inner width as built (LFM2 adjusts intermediate_size: block_auto_adjust_ff_dim)."""
    import torch

    for name, module in model.named_modules():
        if "vision" in name:  # (LFM2-VL: the language model's MLP, not SigLIP2's)
            continue
        if isinstance(module, torch.nn.Linear) and name.endswith(("feed_forward.w1", "mlp.up_proj", "mlp.fc1")):
            return module.out_features
    return int(getattr(text, "intermediate_size", 4 * text.hidden_size))
