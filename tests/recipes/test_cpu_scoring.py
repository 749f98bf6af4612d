"""SFT, DPO, KTO and GRPO on a CPU score only the trained positions in TRL's fused output layer (recipes/host_syncs.py), as TRL does on
GPUs: the same losses, log-probabilities and gradients as scoring every position."""

from __future__ import annotations

import pytest
import torch

from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer


def _scored(model, ids, labels):
    model.zero_grad()
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    out.loss.backward()
    return out.loss.detach(), out.log_probs.detach(), model.lm_head.weight.grad.clone()


def test_scoring_the_trained_positions_only_gives_the_values_of_scoring_all(monkeypatch):
    import trl.trainer.utils as trl_utils
    from trl.trainer.utils import add_fused_lm_head

    from leap_finetune.recipes.host_syncs import score_trained_tokens_only_on_cpu

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    model = build_tiny_model("tiny-lfm2", tokenizer)
    add_fused_lm_head(model)
    ids = torch.tensor([tokenizer.encode("a prompt that is not trained, then an answer that is")])
    labels = ids.clone()
    labels[0, : ids.shape[1] // 2] = -100
    cpu = torch.device("cpu")

    # TRL's own choice (an earlier trainer in this process may have patched it already); restored after the test
    monkeypatch.setattr(trl_utils, "_use_triton", getattr(trl_utils._use_triton, "original", trl_utils._use_triton))
    assert not trl_utils._use_triton(cpu)  # TRL's own choice on a CPU: every position
    every = _scored(model, ids, labels)
    score_trained_tokens_only_on_cpu()
    score_trained_tokens_only_on_cpu()  # (twice: one patch)
    assert trl_utils._use_triton(cpu)
    trained = _scored(model, ids, labels)
    for a, b in zip(every, trained, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("recipe", ["sft", "dpo", "kto", "grpo"])
def test_every_trainer_with_the_fused_output_layer_scores_the_trained_positions_only(recipe, monkeypatch):
    import importlib

    import trl.trainer.utils as trl_utils

    monkeypatch.setattr(trl_utils, "_use_triton", getattr(trl_utils._use_triton, "original", trl_utils._use_triton))
    assert not trl_utils._use_triton(torch.device("cpu"))
    importlib.import_module(f"leap_finetune.recipes.{recipe}").trainer_class()
    assert trl_utils._use_triton(torch.device("cpu"))
