"""LFM2-MoE's routers in training (models/moe_router.py): the load-balancing loss reaches the gradients as if
added to the loss, scaled for gradient accumulation; the load counts real tokens only; forwards without
gradients add nothing; models without experts get no hooks."""

from __future__ import annotations

import math

import pytest
import torch

from leap_finetune.models import moe_router
from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer

IDS = torch.tensor([[20, 21, 22, 23, 24, 25, 26, 27], [30, 31, 32, 33, 34, 35, 36, 37]])


def _moe():
    model = build_tiny_model("tiny-lfm2-moe", load_tiny_tokenizer("tiny-lfm2-moe"))
    model.config.use_cache = False
    return model.train()


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _step(coef: float, accumulation: int = 1) -> torch.Tensor:
    model = _moe()
    moe_router.attach(model, coef, 0.0, accumulation)
    model(input_ids=IDS, labels=IDS).loss.backward()
    return _grads(model)


def test_the_attached_loss_has_the_gradient_of_the_loss_plus_coefficient_times_the_balance_loss():
    coef = 0.5  # (large, so that the balance loss's share of the gradient is far above float noise)
    hooked = _step(coef)
    model = _moe()
    balances = []

    def capture(module, args, output):
        logits, _, selected = output
        balances.append(moe_router.layer_losses(logits, selected, module.num_experts, None)[0])

    for gate in moe_router.routers(model):
        gate.register_forward_hook(capture)
    loss = model(input_ids=IDS, labels=IDS).loss
    assert len(balances) == 3  # (tiny-lfm2-moe: one dense layer, three routed)
    (loss + coef * torch.stack(balances).sum()).backward()
    torch.testing.assert_close(hooked, _grads(model), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(hooked, _step(0.0), atol=1e-6)  # the balance loss did change the gradient


def test_gradient_accumulation_divides_the_balance_loss_like_the_loss():
    plain = _step(0.0)
    once, halved = _step(0.5) - plain, _step(0.5, accumulation=2) - plain
    torch.testing.assert_close(halved, once / 2, atol=1e-6, rtol=1e-4)


def test_the_balance_loss_is_one_at_an_even_load_and_grows_with_imbalance():
    even_logits = torch.zeros(4, 2)
    even = torch.tensor([[0], [1], [0], [1]])
    balance, z, load = moe_router.layer_losses(even_logits, even, 2, None)
    assert balance.item() == pytest.approx(1.0)
    assert load.tolist() == [2, 2]
    assert z.item() == pytest.approx(math.log(2) ** 2)  # logsumexp of two zeros
    skewed_logits = torch.tensor([[3.0, -3.0]] * 4)
    skewed, _, _ = moe_router.layer_losses(skewed_logits, torch.zeros(4, 1, dtype=torch.long), 2, None)
    # every token to expert 0 (f = [1, 0]) with P_0 = sigmoid(3) / (sigmoid(3) + sigmoid(-3))
    share = torch.sigmoid(torch.tensor(3.0)) / (torch.sigmoid(torch.tensor(3.0)) + torch.sigmoid(torch.tensor(-3.0)))
    assert skewed.item() == pytest.approx(2 * share.item())


def test_the_load_counts_the_real_tokens_of_a_padded_batch_and_sums_to_tokens_times_top_k():
    model = _moe()
    stats = moe_router.attach(model, 0.001, 0.001, 1)
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    model(input_ids=IDS, attention_mask=mask, labels=IDS).loss.backward()
    metrics = stats.read()
    assert metrics["moe/routed_tokens"] == 13 * model.config.num_experts_per_tok
    assert 0 <= metrics["moe/expert_load_min"] <= 1 <= metrics["moe/expert_load_max"]
    assert 0 < metrics["moe/expert_load_entropy"] <= 1
    assert metrics["moe/aux_loss"] >= 1.0 - 1e-6  # (its least value, at an even load)
    assert "moe/z_loss" in metrics
    assert stats.read() is None  # read once: the next log starts from nothing


def test_forwards_without_gradients_add_nothing():
    model = _moe()
    stats = moe_router.attach(model, 0.5, 0.0, 1)
    with torch.no_grad():
        model(input_ids=IDS)
    assert stats.read() is None


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_layers_count_each_token_once(reentrant):
    model = _moe()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.enable_input_require_grads()
    stats = moe_router.attach(model, 0.5, 0.0, 1)
    model(input_ids=IDS, labels=IDS).loss.backward()
    assert stats.read()["moe/routed_tokens"] == IDS.numel() * model.config.num_experts_per_tok
    assert next(p for n, p in model.named_parameters() if "gate" in n).grad.abs().sum() > 0  # (the loss arrived)


def test_a_model_without_experts_gets_no_hooks_and_the_coefficient_comes_from_the_config():
    dense = build_tiny_model("tiny-lfm2", load_tiny_tokenizer("tiny-lfm2"))
    assert moe_router.attach_from_training(dense, {"router_aux_loss_coef": 0.1}) is None
    model = _moe()
    assert moe_router.model_aux_loss_coef(model.config) == moe_router.DEFAULT_AUX_LOSS_COEF
    model.config.router_aux_loss_coef = 0.02  # (a model that carries its own, as Mixtral's config does)
    assert moe_router.model_aux_loss_coef(model.config) == 0.02
    line = moe_router.attach_from_training(model, {})
    assert "x 0.02 (the model's own)" in line and "3 routed layers" in line


def test_the_expert_bias_stays_float32_under_a_bf16_base_and_in_the_rollout_copy():
    """A bias of 1e-3 on a score near 0.5 rounds away in bf16 (its step there is 2e-3): the routing would change."""
    from leap_finetune.rl.sampler import rollout_copy

    model = _moe().to(torch.bfloat16)
    biases = [m.expert_bias for m in model.modules() if hasattr(m, "expert_bias")]
    assert biases and all(b.dtype == torch.bfloat16 for b in biases)
    assert "3 routed layers" in moe_router.attach_from_training(model, {})
    assert all(m.expert_bias.dtype == torch.float32 for m in model.modules() if hasattr(m, "expert_bias"))
    shadow = rollout_copy(model, torch.bfloat16)
    assert all(m.expert_bias.dtype == torch.float32 for m in shadow.modules() if hasattr(m, "expert_bias"))
    assert next(shadow.parameters()).dtype == torch.bfloat16
    with torch.no_grad():  # (the float32 bias and the bf16 scores route together)
        assert shadow(input_ids=IDS).logits.dtype == torch.bfloat16
