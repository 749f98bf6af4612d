"""plan and the config table name the rollout engine measured faster for the model's size (rl/engines.py)."""

from __future__ import annotations

import pytest

from leap_finetune.rl.engines import MEASURED, measured_size, rollout_advice


@pytest.mark.parametrize(
    "model_id, size",
    [
        ("LiquidAI/LFM2-1.2B", "LFM2-1.2B"),
        ("LiquidAI/LFM2.5-1.2B-Instruct", "LFM2-1.2B"),
        ("LiquidAI/LFM2-350M", "LFM2-350M"),
        ("/models/lfm2_700m", "LFM2-350M"),
        ("LiquidAI/LFM2-8B-A1B", None),
        ("./outputs/grpo-tiny-warmup", None),
        ("tiny-lfm2", None),
    ],
)
def test_the_measured_row_comes_from_the_size_in_the_name(model_id, size):
    assert measured_size(model_id) == size


def test_the_advice_names_the_faster_engine_with_its_numbers():
    colocate = rollout_advice("LiquidAI/LFM2-1.2B", engine="vLLM, colocate", lora=False)
    row = MEASURED["LFM2-1.2B"]
    assert row["sampler"] > row["vllm"] and row["sampler"] > row["generate"]  # (what the line below claims)
    assert colocate.startswith(
        "faster at LFM2-1.2B size: use_vllm: false (leap-finetune's sampler), 27.8k rollout "
        "tokens/s vs 6.0k for vLLM colocate (4.7x;"
    )
    assert rollout_advice(
        "LiquidAI/LFM2-350M", engine="leap-finetune sampler (CUDA graphs on a GPU)", lora=False
    ).endswith("this config's choice")
    # a config whose settings send the rollouts to generate is told so, not that it chose the sampler
    assert rollout_advice(
        "LiquidAI/LFM2-350M", engine="transformers' generation (cache_implementation is not static)", lora=False
    ).endswith(
        "this config rolls out with transformers' generation (cache_implementation is not static), not the sampler"
    )
    assert "not this size" in rollout_advice("LiquidAI/LFM2-8B-A1B", engine="vLLM, colocate", lora=False)
    assert rollout_advice("LiquidAI/LFM2-1.2B", engine="vLLM, colocate", lora=True).startswith(
        "faster at LFM2-1.2B size with LoRA: use_vllm: false (leap-finetune's sampler), 19.4k rollout tokens/s vs 5.9k"
    )
    assert rollout_advice("LiquidAI/LFM2-1.2B", engine="vLLM, server", lora=False, vllm_mode="server").startswith(
        "vLLM server mode (rollouts on their own GPUs) is not measured yet; on one GPU, faster at LFM2-1.2B"
    )
