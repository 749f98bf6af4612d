"""A model's module names without its weights: the architecture is built on PyTorch's meta device
from config.json (a local folder, the Hub cache, or a built-in tiny model), so the driver can check
LoRA's `target_modules` before anything is loaded or downloaded."""

from __future__ import annotations

import re

from leap_finetune.errors import LeapError


def module_names(model_id: str, tokenizer, init_kwargs: dict | None = None, head: bool = True) -> dict[str, str] | None:
    """Every module name of the model with its class name, or None when its config.json is not at hand.
    `head=False`: the bare model (AutoModel), as sentence-transformers loads a retrieval backbone."""
    model = meta_model(model_id, tokenizer, init_kwargs, head)
    return _names(model) if model is not None else None


def meta_model(model_id: str, tokenizer, init_kwargs: dict | None = None, head: bool = True):
    """The model built on the meta device from its config (no weights), or None when its config is not at hand."""
    import torch

    from leap_finetune.models.tiny import TINY_MODELS, build_tiny_model

    if model_id in TINY_MODELS:
        with torch.device("meta"):
            return build_tiny_model(model_id, tokenizer)
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForImageTextToText

    from leap_finetune.models.hub import download_kwargs
    from leap_finetune.models.vision import is_vision_model

    kwargs = {
        **download_kwargs(model_id),
        **{
            k: v
            for k, v in (init_kwargs or {}).items()
            if k in ("revision", "trust_remote_code", "cache_dir", "token", "subfolder", "local_files_only")
        },
    }
    try:
        config = AutoConfig.from_pretrained(model_id, **kwargs)
    except Exception:  # noqa: BLE001 - unreachable or not a transformers model: loading will say so
        return None
    auto = AutoModelForImageTextToText if is_vision_model(model_id) else AutoModelForCausalLM if head else AutoModel
    try:
        with torch.device("meta"):
            return auto.from_config(config, trust_remote_code=kwargs.get("trust_remote_code", False))
    except Exception:  # noqa: BLE001 - an architecture this transformers cannot build: loading will say so
        return None


def check_adapter_fits(folder: str, model, model_id: str, where: str) -> None:
    """adapter_path: every LoRA matrix of the adapter's weights (read from the file's header, not loaded) belongs to
    a module of this model with the same input and output sizes - an adapter trained on another base fails here,
    before a model loads, not in peft's load."""
    import json
    from pathlib import Path

    from safetensors import safe_open

    weights = Path(folder) / "adapter_model.safetensors"
    if not weights.is_file():
        return  # (a .bin adapter: peft's load checks it)
    modules = dict(model.named_modules())
    base = json.loads((Path(folder) / "adapter_config.json").read_text(encoding="utf-8")).get("base_model_name_or_path")
    trained_on = f" (adapter_config.json: trained on {base})" if base else ""
    with safe_open(str(weights), framework="pt") as handle:
        for key in handle.keys():
            found = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
            if not found:
                continue
            name, side = found.groups()
            module = modules.get(name)
            size = handle.get_slice(key).get_shape()[1 if side == "A" else 0]
            kind = "inputs" if side == "A" else "outputs"
            mine = getattr(module, "in_features" if side == "A" else "out_features", None)
            if module is None or (mine is not None and size != mine):
                what = "is not a layer of that model" if module is None else f"has {size} {kind}, that model's {mine}"
                raise LeapError(
                    f"the adapter at {folder} does not fit model_name {model_id}: its layer {name} {what}" + trained_on,
                    where=f"{where}: adapter_path",
                    fix="set model_name to the base the adapter was trained on, or train a new adapter (remove "
                    "adapter_path)",
                )


def module_table(model) -> dict[str, str]:
    return _names(model)


def _names(model) -> dict[str, str]:
    return {name: type(module).__name__ for name, module in model.named_modules()}


def check_lora_targets(peft: dict, names: dict[str, str], model_id: str, where: str) -> None:
    """peft matches a `target_modules` entry against a module name's last components (a string is a
    regular expression over the whole name); an entry that matches nothing is a typo or another
    architecture's name, and peft would fail (or, for some entries, silently adapt fewer layers)."""
    if not peft.get("target_parameters"):
        _check(peft.get("target_modules"), "target_modules", names, model_id, where)
    _check(peft.get("modules_to_save"), "modules_to_save", names, model_id, where)
    _check_layers(peft.get("layers_to_transform"), names, model_id, where)


def _check_layers(layers, names: dict[str, str], model_id: str, where: str) -> None:
    """`layers_to_transform` indexes the decoder layers."""
    if layers is None:
        return
    wanted = [layers] if isinstance(layers, int) else list(layers)
    present = {int(m.group(1)) for name in names if (m := re.search(r"\.layers\.(\d+)$", name))}
    missing = [i for i in wanted if i not in present]
    if present and missing:
        raise LeapError(
            f"peft_config.layers_to_transform names layer(s) {missing}, but {model_id} has layers 0-{max(present)}",
            where=where,
            fix=f"use layer indices from 0 to {max(present)}",
        )


def _check(targets, key: str, names: dict[str, str], model_id: str, where: str) -> None:
    if targets == "all-linear" or (targets is None and key == "modules_to_save"):
        return
    if targets is None or targets == []:
        raise LeapError(
            f"peft_config.{key} is empty: LoRA would adapt no layer",
            where=where,
            fix="name the layers to adapt (DEFAULT_LORA: q_proj, k_proj, v_proj, out_proj, in_proj, w1, w2, "
            "w3), or all-linear",
        )
    if isinstance(targets, str):
        if not any(re.fullmatch(targets, name) for name in names):
            raise LeapError(
                f"peft_config.{key} '{targets}' (a regular expression) matches no module of {model_id}",
                where=where,
                fix="to name modules, write a list (e.g. [q_proj, v_proj]); " + _suggest(names),
            )
        return
    missing = [t for t in targets if not any(name == t or name.endswith("." + t) for name in names)]
    if missing:
        raise LeapError(
            f"peft_config.{key} names {', '.join(repr(m) for m in missing)}, which "
            f"{'is not a module' if len(missing) == 1 else 'are not modules'} of {model_id}",
            where=where,
            fix=_suggest(names),
        )


def _suggest(names: dict[str, str]) -> str:
    layers = ("Linear", "Conv1d", "Conv2d", "Embedding")
    leaves = sorted({name.rsplit(".", 1)[-1] for name, kind in names.items() if name and kind in layers})
    return (
        "this model's linear, convolution and embedding layers: "
        + ", ".join(leaves)
        + " (or target_modules: all-linear)"
    )


def lora_coverage(peft: dict, names: dict[str, str]) -> tuple[str, bool]:
    """(a line saying which of the language model's linear layers LoRA adapts, per target; whether that is fewer
    than half of them - a pattern written for another architecture, such as LLaMA's o_proj/gate_proj, matches
    few of LFM2's). Matched as peft matches them. A mixture of experts' experts (3-D weights, no linear layer)
    are said apart: adapted with lora_experts, else not."""
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    options = {k: v for k, v in peft.items() if k in ("target_modules", "exclude_modules")}
    every = str(options.get("target_modules", "")).lower() == "all-linear"  # (peft expands it when it wraps)
    config = LoraConfig(**{**options, "target_modules": ".*"} if every else options)
    linear = [
        n
        for n, kind in names.items()
        if kind == "Linear" and not n.endswith("lm_head") and "vision" not in n and "multi_modal_projector" not in n
    ]
    adapted: dict[str, int] = {}
    missed: dict[str, int] = {}
    for name in linear:
        leaf = name.rsplit(".", 1)[-1]
        counts = adapted if check_target_module_exists(config, name) else missed
        counts[leaf] = counts.get(leaf, 0) + 1
    total, done = len(linear), sum(adapted.values())
    line = f"LoRA adapts {done} of the model's {total} linear layers ({_counted(adapted) or 'none'})"
    if missed:
        line += f"; not adapted: {_counted(missed)}"
    experts = sum(kind.endswith("Experts") for kind in names.values())
    if experts:
        line += f"; the experts of {experts} routed layers: " + (
            "adapted (lora_experts)" if peft.get("lora_experts") else "not adapted (lora_experts: true adapts them)"
        )
    return line, bool(total) and done < total / 2


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{leaf} {n}" for leaf, n in counts.items())
