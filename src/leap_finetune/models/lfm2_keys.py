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
    those it set. Other architectures are left as they are (models/architectures.py says which have them). For
    LFM2-VL it also has the vision tower saved in the published layout (`save_vision_in_published_layout`; the model
    itself takes that layout back through `load_published_vision_names`)."""
    from leap_finetune.models.architectures import architecture, supports

    found = architecture(getattr(config, "model_type", None))
    if getattr(config, "model_type", None) == "lfm2_vl":
        save_vision_in_published_layout(config.model_type)
    text = getattr(config, "text_config", None) if found is not None and found.vision else config
    if text is None or not supports(getattr(text, "model_type", None), "original_keys"):
        return []
    added = []
    for key, value in original_lfm2_keys(text).items():
        if getattr(text, key, None) is None:
            setattr(text, key, value)
            added.append(key)
    return added


# LFM2-VL's SigLIP2 weights: the published checkpoints (and vLLM's LFM2-VL, llama.cpp's converter) name them under
# `model.vision_tower.vision_model.`; transformers 5 keeps the module flat (`model.vision_tower.embeddings...`), saves
# a model loaded from a published checkpoint back in the published layout, and one built from a config flat.
VISION_TOWER = "model.vision_tower."
PUBLISHED_VISION = VISION_TOWER + "vision_model."


def published_vision_name(name: str) -> str:
    """A parameter name of LFM2-VL (with or without the leading `model.`) in the published layout."""
    for prefix in (VISION_TOWER, VISION_TOWER.removeprefix("model.")):
        if name.startswith(prefix) and not name.startswith(prefix + "vision_model."):
            return prefix + "vision_model." + name[len(prefix) :]
    return name


def save_vision_in_published_layout(model_type: str) -> None:
    """LFM2-VL built from a config (the tiny model, the benches' random weights) and saved in this process writes the
    published layout too - as transformers already does for one loaded from a published checkpoint - through its own
    conversion mapping (renamed on load, reversed on save), so vLLM loads it (measured 2026-12-07: vLLM 0.26 refuses
    the flat names). A mapping transformers ships for the model type is left as it is."""
    try:
        from transformers.conversion_mapping import (
            get_checkpoint_conversion_mapping,
            register_checkpoint_conversion_mapping,
        )
        from transformers.core_model_loading import WeightRenaming
    except ImportError:  # (a transformers without conversion mappings saves what it loads)
        return
    if get_checkpoint_conversion_mapping(model_type) is not None:
        return
    pattern = "^" + PUBLISHED_VISION.replace(".", r"\.")
    register_checkpoint_conversion_mapping(model_type, [WeightRenaming(pattern, VISION_TOWER)])


def load_published_vision_names(model) -> None:
    """`model.load_state_dict` of an LFM2-VL takes the published layout as well as its own flat names: the Trainer
    resumes a checkpoint (and loads the best one at the end) with load_state_dict on the saved file, outside
    transformers' renaming, and the checkpoint holds the published layout (a model loaded from a published checkpoint
    always saved it). Without this the vision tower's weights were left as they were, silently (strict=False)."""
    if getattr(getattr(model, "config", None), "model_type", None) != "lfm2_vl":
        return

    def flat_names(module, state_dict, prefix, *_):
        published = prefix + PUBLISHED_VISION
        for key in [k for k in state_dict if k.startswith(published)]:
            state_dict[prefix + VISION_TOWER + key[len(published) :]] = state_dict.pop(key)

    model.register_load_state_dict_pre_hook(flat_names)
