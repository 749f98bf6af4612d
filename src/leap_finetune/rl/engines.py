"""Which rollout engine is faster for a GRPO run, from what was measured (bench/RESULTS.md, 2026-12-01): one H200,
64 completions x 256 new tokens per step, random-weight LFM2 architectures, bf16 autocast, full fine-tuning and LoRA.
`plan` and the run's config table quote it beside the engine the config chose."""

from __future__ import annotations

import re

# rollout tokens/s: "sampler" = leap-finetune's decoding loop (use_vllm: false, rl/sampler.py), "generate" =
# transformers' generate with its compiled decoding step (the path before the sampler), "vllm" = vLLM 0.26 colocate
MEASURED = {
    "LFM2-350M": {"sampler": 43_016, "generate": 16_397, "vllm": 7_165},
    "LFM2-1.2B": {"sampler": 27_814, "generate": 8_602, "vllm": 5_966},
}
# LoRA (DEFAULT_LORA); vLLM's figures are the rollouts of the GRPO runs that learned (bench/vllm_runs.py grpo_learns)
LORA_MEASURED = {
    "LFM2-350M": {"sampler": 26_774, "generate": 6_689, "vllm": 6_892},
    "LFM2-1.2B": {"sampler": 19_435, "generate": 3_754, "vllm": 5_948},
}
WHERE = "one H200, 64 x 256 tokens, bench/RESULTS.md"


def measured_size(model_id: str) -> str | None:
    """The measured row nearest this model's size, from the size in its name (LFM2-350M, LFM2.5-1.2B-Instruct...)."""
    found = re.search(r"(\d+(?:\.\d+)?)\s*([MB])\b", model_id.replace("_", "-"), flags=re.I)
    if not found:
        return None
    billions = float(found.group(1)) / (1000 if found.group(2).upper() == "M" else 1)
    return "LFM2-350M" if billions < 0.8 else "LFM2-1.2B" if billions < 2.0 else None


def _k(value: int) -> str:
    return f"{value / 1000:.1f}k"


def rollout_advice(model_id: str, *, engine: str, lora: bool, vllm_mode: str = "colocate") -> str:
    """One line: the engine measured faster for this model's size, with its rollout tokens/s, against `engine` (the
    one this config uses: report.rollout_engine)."""
    if engine.startswith("vLLM") and vllm_mode == "server":
        return "vLLM server mode (rollouts on their own GPUs) is not measured yet; on one GPU, " + rollout_advice(
            model_id, engine="vLLM, colocate", lora=lora
        )
    size = measured_size(model_id)
    table, kind = (LORA_MEASURED, "LoRA ") if lora else (MEASURED, "")
    if engine.startswith("leap-finetune sampler"):
        verdict = " - this config's choice"
    elif engine.startswith("vLLM"):
        verdict = ""
    else:
        verdict = f" - this config rolls out with {engine}, not the sampler"
    if size is None:
        rows = "; ".join(f"{name}: {_k(r['sampler'])} vs vLLM colocate {_k(r['vllm'])}" for name, r in table.items())
        return (
            f"measured for LFM2 up to 1.2B, not this size: use_vllm: false (leap-finetune's sampler) was faster "
            f"({kind}{rows} rollout tokens/s; {WHERE})" + verdict
        )
    row = table[size]
    faster = row["sampler"] / row["vllm"]
    return (
        f"faster at {size} size{' with LoRA' if lora else ''}: use_vllm: false (leap-finetune's sampler), "
        f"{_k(row['sampler'])} rollout tokens/s vs {_k(row['vllm'])} for vLLM colocate ({faster:.1f}x; {WHERE})"
        + verdict
    )
