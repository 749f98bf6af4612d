"""Varlen attention for packed LFM2 batches (models/varlen_attention.py): with it, a packed row
builds no dense mask, each document attends only to itself, and padded batches still use SDPA's
padding mask. On CPU the per-document SDPA path runs; the CUDA kernel is checked by bench/gpu_check.py."""

from __future__ import annotations

import pytest
import torch
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from leap_finetune.models.packed_conv import enable_exact_packing
from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer
from leap_finetune.models.varlen_attention import NAME, use_varlen_attention

SEQUENCES = [list(range(20, 37)), list(range(40, 49)), list(range(60, 83)), [90, 91]]


def _model(varlen: bool, name: str = "tiny-lfm2"):
    enable_exact_packing()
    tokenizer = load_tiny_tokenizer(name)
    model = build_tiny_model(name, tokenizer).eval()
    model.config.use_cache = False
    if varlen:
        assert use_varlen_attention(model) is not None
        assert model.config._attn_implementation == NAME
    return model


def _packed(examples):
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    return {k: v for k, v in batch.items() if k != "labels"}


BOTH = pytest.mark.parametrize("name", ["tiny-lfm2", "tiny-lfm2-moe"])  # (models/architectures.py)


@BOTH
def test_packed_logits_equal_each_document_alone_and_no_dense_mask_is_built(monkeypatch, name):
    model = _model(varlen=True, name=name)
    built = []
    import transformers.masking_utils as masking

    real_sdpa_mask = masking.sdpa_mask
    monkeypatch.setattr(masking, "sdpa_mask", lambda *a, **k: built.append(1) or real_sdpa_mask(*a, **k))
    with torch.no_grad():
        packed = model(**_packed([{"input_ids": s} for s in SEQUENCES])).logits[0]
    assert built == []  # the boundaries travelled as cu_seq_lens; no (total x total) mask
    with torch.no_grad():
        alone = torch.cat([model(input_ids=torch.tensor([s])).logits[0] for s in SEQUENCES])
    torch.testing.assert_close(packed, alone, atol=2e-5, rtol=1e-4)


def test_packed_row_without_boundaries_is_still_kept_apart():
    """position ids alone (no cu_seq_lens): the documents are recovered from where positions restart."""
    model = _model(varlen=True)
    batch = _packed([{"input_ids": s} for s in SEQUENCES])
    plain = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "seq_idx": batch["seq_idx"]}
    with torch.no_grad():
        with_bounds = model(**batch).logits
        without = model(**plain).logits
    torch.testing.assert_close(without, with_bounds, atol=1e-6, rtol=1e-5)


def test_padded_batches_keep_sdpa_with_the_padding_mask():
    reference, varlen = _model(varlen=False), _model(varlen=True)
    batch = DataCollatorForLanguageModeling(pad_token_id=0)([{"input_ids": s} for s in SEQUENCES])
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = varlen(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    keep = batch["attention_mask"].bool()
    torch.testing.assert_close(got[keep], expected[keep], atol=1e-6, rtol=1e-5)


@BOTH
def test_packed_step_has_the_loss_and_gradients_of_the_padded_sdpa_step(name):
    examples = [{"input_ids": s, "labels": [-100] * (len(s) // 2) + s[len(s) // 2 :]} for s in SEQUENCES]
    results = []
    for varlen, padding_free in ((False, False), (True, True)):
        model = _model(varlen=varlen, name=name).train()
        loss = model(**DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)(examples)).loss
        loss.backward()
        results.append((loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], atol=1e-5, rtol=1e-4)


def test_models_we_did_not_verify_keep_their_attention():
    class Other:
        class config:  # noqa: N801 - stands in for a transformers config
            model_type = "llama"
            _attn_implementation = "sdpa"

    assert use_varlen_attention(Other()) is None
    model = _model(varlen=False)
    model.set_attn_implementation("eager")
    model.config._attn_implementation = "flex_attention"  # a user's explicit choice is kept
    assert use_varlen_attention(model) is None


def test_compiled_cpu_attention_keeps_documents_apart_and_traces_once_for_any_document_count():
    """Inside a compiled layer on a CPU, attention over a flat row is one SDPA call with a block-diagonal mask built
    from the boundaries: equal to each document attending to itself alone (empty documents and grouped heads
    included), and one graph serves rows with different numbers of documents (the host loop recompiled per count)."""
    import torch._dynamo

    from leap_finetune.models.varlen_attention import _per_document_sdpa

    torch.manual_seed(0)
    calls = []

    def attend(q, k, v, cu_seq_lens):
        return _per_document_sdpa(q, k, v, cu_seq_lens, None, 2)

    def counting_backend(graph, inputs):
        calls.append(graph)
        return graph.forward

    torch._dynamo.reset()
    compiled = torch.compile(attend, backend=counting_backend, dynamic=True, fullgraph=True)
    for bounds in ([0, 5, 5, 12, 30, 31, 40], [0, 17, 40], [0, 3, 9, 20, 26]):
        total = bounds[-1]
        q, k, v = torch.randn(total, 4, 16), torch.randn(total, 2, 16), torch.randn(total, 2, 16)
        cu = torch.tensor(bounds, dtype=torch.int32)
        expected = attend(q, k, v, cu)  # eager: each document on its own
        assert torch.allclose(compiled(q, k, v, cu), expected, atol=1e-5)
    assert len(calls) == 1  # fullgraph: no graph break; one trace for three counts and lengths
