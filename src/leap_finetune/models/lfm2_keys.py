"""The LFM2 config keys that vLLM reads and transformers no longer writes.

LiquidAI's LFM2 checkpoints carry the architecture twice: transformers' names (`hidden_size`, `intermediate_size`,
`norm_eps`, `layer_types`) and the original ones (`conv_dim`, `block_dim`, `block_ff_dim`, `block_norm_eps`,
`full_attn_idxs`, ...). transformers' `Lfm2Config` reads only its own, and a config it builds from scratch lacks the
originals - but vLLM's LFM2 (0.26: `config.conv_dim`, `config.block_dim`) reads them, and fails with an
AttributeError on a model that lacks them (measured on the H200, 2026-12-01). LFM2-MoE gets the same keys (its
`block_ff_dim` is the dense layers' width): harmless where its vLLM class reads transformers' names. Every LFM2
model leap-finetune builds
(tiny models, bench models) or loads gets them here, so that everything it saves - checkpoints, `model/`, exports,
merged LoRA - loads in vLLM. They are derived from transformers' own values, never overriding a key that is set.
"""

from __future__ import annotations


def original_lfm2_keys(config) -> dict:
    """The original keys of an LFM2 text config, computed from transformers' names."""
    layer_types = list(getattr(config, "layer_types", None) or [])
    return {
        "conv_dim": config.hidden_size,
        "conv_dim_out": config.hidden_size,
        "block_dim": config.hidden_size,
        "block_ff_dim": config.intermediate_size,
        "block_norm_eps": config.norm_eps,
        "full_attn_idxs": [i for i, kind in enumerate(layer_types) if kind == "full_attention"],
    }


def add_original_lfm2_keys(config) -> list[str]:
    """Sets the missing original keys on an LFM2 or LFM2-MoE config (or an LFM2-VL config's text config); returns
    those it set. Other architectures are left as they are (models/architectures.py says which have them)."""
    from leap_finetune.models.architectures import architecture, supports

    found = architecture(getattr(config, "model_type", None))
    text = getattr(config, "text_config", None) if found is not None and found.vision else config
    if text is None or not supports(getattr(text, "model_type", None), "original_keys"):
        return []
    added = []
    for key, value in original_lfm2_keys(text).items():
        if getattr(text, key, None) is None:
            setattr(text, key, value)
            added.append(key)
    return added
