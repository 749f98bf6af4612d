"""Packing is exact for LFM2: packed sequences see each other neither through attention nor
through the short convolutions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from leap_finetune.models.packed_conv import enable_exact_packing, packed_causal_conv1d
from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

SEQUENCES = [list(range(20, 37)), list(range(40, 49)), list(range(60, 83)), [90, 91]]


def _model(name: str = "tiny-lfm2"):
    tokenizer = load_tiny_tokenizer(name)
    model = build_tiny_model(name, tokenizer)
    model.config.use_cache = False
    return model


def test_upstream_reference_path_still_cannot_keep_packed_sequences_apart():
    """If this starts failing, transformers learned to pack LFM2 without causal_conv1d and our
    kernel (models/packed_conv.py) may be retired."""
    from leap_finetune.models import packed_conv

    enable_exact_packing()
    upstream = packed_conv.UPSTREAM["transformers.models.lfm2.modeling_lfm2"]
    x = torch.randn(1, 4, 6)
    with pytest.raises(ValueError, match="can't keep packed sequences apart"):
        upstream(x, torch.randn(4, 3), None, seq_idx=torch.zeros(1, 6, dtype=torch.int32))


def test_without_boundaries_it_equals_a_plain_causal_conv():
    x, weight, bias = torch.randn(2, 8, 11), torch.randn(8, 3), torch.randn(8)
    expected = F.conv1d(x, weight.unsqueeze(1), bias, padding=2, groups=8)[..., :11]
    torch.testing.assert_close(packed_causal_conv1d(x, weight, bias), expected)


def test_taps_never_cross_a_sequence_boundary():
    x, weight = torch.randn(1, 8, 10), torch.randn(8, 3)
    seq_idx = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 2, 2, 2]])
    packed = packed_causal_conv1d(x, weight, seq_idx=seq_idx)
    for start, end in [(0, 4), (4, 7), (7, 10)]:
        alone = packed_causal_conv1d(x[..., start:end], weight)
        torch.testing.assert_close(packed[..., start:end], alone)


# LFM2 and LFM2-MoE (models/architectures.py: both pack through the same convolution and attention)
BOTH = pytest.mark.parametrize("name", ["tiny-lfm2", "tiny-lfm2-moe"])


@BOTH
def test_packed_logits_equal_each_sequence_run_alone(name):
    enable_exact_packing()
    model = _model(name).eval()
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)([{"input_ids": s} for s in SEQUENCES])
    with torch.no_grad():
        packed = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        alone = torch.cat([model(input_ids=torch.tensor([s])).logits[0] for s in SEQUENCES])
    torch.testing.assert_close(packed, alone, atol=2e-5, rtol=1e-4)


@BOTH
def test_one_packed_step_has_the_loss_and_gradients_of_the_padded_step(name):
    enable_exact_packing()
    examples = [{"input_ids": s, "labels": [-100] * (len(s) // 2) + s[len(s) // 2 :]} for s in SEQUENCES]
    losses, grads = [], []
    for padding_free in (False, True):
        model = _model(name).train()
        batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(examples)
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(losses[1], losses[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)
