"""Mixture-of-experts routers during training: the load-balancing (aux) loss, the optional z-loss, and the expert
load metrics, for every training type alike.

transformers' LFM2-MoE computes no auxiliary loss (the model was trained with an expert bias that balances the
load without one), and each trainer (SFT, DPO, KTO, GRPO) computes its own loss, so adding a term to "the loss"
would need one change per trainer. Instead each router gets a forward hook that computes its layer's losses and
attaches them to the routing weights it returns, with an autograd function that passes the weights through
unchanged and, in the backward pass, gives the attached loss the gradient `coefficient / accumulation` - as if it
had been added to the loss the step backpropagates (the technique Megatron-LM uses for the same reason: the MoE
loss reaches the backward pass whichever loss the trainer computes). Forwards without gradients (evaluation,
the reference model, rollouts) add nothing.

Per layer, over the batch's real tokens (the attention mask's, when the batch is padded):
- load-balancing loss (DeepSeek-V3's balance loss, Switch's for softmax routers): E * sum_e f_e * P_e, f_e the
  share of the top-k choices that went to expert e, P_e the mean of the token's scores normalised to sum 1; 1.0 at
  a perfectly even load;
- z-loss (ST-MoE): mean over tokens of logsumexp(router logits)^2, which keeps the logits small;
- expert load: tokens per expert, summed on the device and read once per logging step (recipes/host_syncs.py's
  rule: no host sync per step).
"""

from __future__ import annotations

import functools
import math

import torch

from leap_finetune.models.architectures import architecture

# LFM2-MoE carries no aux-loss coefficient (it balances with its expert bias); models that carry one
# (router_aux_loss_coef: Mixtral, Qwen-MoE, OLMoE) keep theirs. 1e-3 is Qwen-MoE's, small enough not to pull a
# trained router away from what it learned (docs/moe.md).
DEFAULT_AUX_LOSS_COEF = 1e-3


class _AttachLoss(torch.autograd.Function):
    """Returns `weights` unchanged; in the backward pass `loss` gets `scale` as its gradient, and the layer's
    metrics are added to the stats - in the backward pass, which runs once for every forward that trains whatever
    the activation checkpointing (a recomputed forward's node is the one that runs with use_reentrant; the
    original's without), and never for a forward that does not train."""

    @staticmethod
    def forward(ctx, weights, loss, scale: float, record):
        ctx.save_for_backward(loss)
        ctx.scale, ctx.record = scale, record
        return weights.view_as(weights)

    @staticmethod
    def backward(ctx, grad):
        (loss,) = ctx.saved_tensors
        ctx.record()
        return grad, torch.full_like(loss, ctx.scale), None, None


def model_aux_loss_coef(config) -> float:
    """The model's own coefficient where its config carries one, else DEFAULT_AUX_LOSS_COEF."""
    text = getattr(config, "text_config", None) or config
    value = getattr(text, "router_aux_loss_coef", None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else DEFAULT_AUX_LOSS_COEF


class RouterStats:
    """The hooks' state on one model: the coefficients, the accumulation that scales them, and the sums of the
    layers' losses and loads since the last read (device tensors)."""

    def __init__(self, aux_coef: float, z_coef: float, accumulation: int, num_experts: int, layers: int):
        self.aux_coef, self.z_coef = aux_coef, z_coef
        self.accumulation = max(1, accumulation)
        self.num_experts, self.layers = num_experts, layers
        self.mask = None  # the current forward's attention mask (batch, length), when padded
        self.backbone = None  # the module flat_rows.py flattens (its _leap_flat: this forward's flat layout)
        self.reset()

    def reset(self) -> None:
        self.load = None  # (layers, experts): top-k choices per expert
        self.aux_sum = None  # sum over layers and forwards of the balance loss
        self.z_sum = None
        self.forwards = 0  # router calls with gradients since the last read (layers x micro-batches)

    def add(self, layer: int, load: torch.Tensor, balance: torch.Tensor, z: torch.Tensor) -> None:
        """One layer's metrics of one trained forward (device tensors: no wait for the GPU)."""
        if self.load is None:
            self.load = torch.zeros(
                self.layers, self.num_experts, device=load.device, dtype=torch.float64
            )  # (exact counts)
        self.load[layer] += load
        self.aux_sum = balance if self.aux_sum is None else self.aux_sum + balance
        if self.z_coef:
            self.z_sum = z if self.z_sum is None else self.z_sum + z
        self.forwards += 1

    def read(self) -> dict | None:
        """The metrics since the last read (one host sync), then reset; None when no training forward ran."""
        if self.load is None or not self.forwards:
            return None
        load = self.load.float()
        aux = float(self.aux_sum) / self.forwards
        z = float(self.z_sum) / self.forwards if self.z_sum is not None else None
        self.reset()
        return summarise_load(load, aux, z)


def summarise_load(load: torch.Tensor, aux: float, z: float | None) -> dict:
    """Per-layer shares of the tokens each expert got, summarised over the layers: the least and most loaded
    expert (1.0 = its fair share), and the entropy of the load as a fraction of the even load's."""
    totals = load.sum(dim=1, keepdim=True).clamp(min=1)
    share = load / totals  # (layers, experts)
    experts = load.shape[1]
    entropy = -(share * share.clamp(min=1e-12).log()).sum(dim=1) / math.log(experts)
    out = {
        "moe/aux_loss": round(aux, 6),
        "moe/expert_load_min": round(float(share.min() * experts), 4),
        "moe/expert_load_max": round(float(share.max() * experts), 4),
        "moe/expert_load_entropy": round(float(entropy.mean()), 4),
        "moe/routed_tokens": int(load.sum() // max(1, load.shape[0])),  # top-k choices per layer
    }
    if z is not None:
        out["moe/z_loss"] = round(z, 6)
    return out


def layer_losses(logits: torch.Tensor, selected: torch.Tensor, num_experts: int, real: torch.Tensor | None):
    """(balance loss, z-loss, load per expert) of one router call over its real tokens (`real`: 1 for a token, 0
    for padding; None: every token). Shapes stay static and nothing waits for the GPU (no bincount, no boolean
    indexing: both would make the host wait for the device)."""
    logits = logits.float()
    weight = torch.ones_like(logits[:, 0]) if real is None else real.reshape(-1).to(logits.dtype)
    tokens = weight.sum().clamp(min=1)
    top_k = selected.shape[-1]
    load = torch.zeros(num_experts, device=logits.device, dtype=torch.float32)
    load = load.scatter_add(0, selected.reshape(-1), weight[:, None].expand(-1, top_k).reshape(-1))
    scores = torch.sigmoid(logits)  # (LFM2-MoE's routers score with a sigmoid)
    probs = scores / scores.sum(dim=-1, keepdim=True).clamp(min=1e-9)
    share = load / (tokens * top_k)  # f_e: sums to 1
    balance = num_experts * (share.detach() * (probs * weight[:, None]).sum(dim=0) / tokens).sum()
    z = (torch.logsumexp(logits, dim=-1).pow(2) * weight).sum() / tokens
    return balance, z, load


def _router_hook(stats: RouterStats, layer: int):
    def hook(module, args, output):
        logits, weights, selected = output
        if not torch.is_grad_enabled() or not weights.requires_grad:
            return output  # (evaluation, the reference model, rollouts: nothing trains)
        real = _real_tokens(stats.mask, logits.shape[0], getattr(stats.backbone, "_leap_flat", None))
        balance, z, load = layer_losses(logits, selected, stats.num_experts, real)
        total = balance * stats.aux_coef + (z * stats.z_coef if stats.z_coef else 0)
        done = (load, balance.detach(), z.detach())
        record = functools.partial(stats.add, layer, *done)
        return logits, _AttachLoss.apply(weights, total, 1.0 / stats.accumulation, record), selected

    # Eager inside a compiled decoder layer (speed.compile_layers): the metrics it records in the backward pass
    # are a side effect torch.compile cannot trace. The router is a small part of the layer; the graph breaks
    # around it, the experts stay compiled.
    return torch.compiler.disable(hook)


def _real_tokens(mask, tokens: int, flat=None):
    """Which of the router's tokens are real (1) or padding (0): for a padded batch that models/flat_rows.py ran as
    one flat row (its state on the backbone: rows, length, the real tokens' indices), the first len(indices)
    positions (the rest pads the row to a multiple of 8); else the batch's own attention mask; None (no mask):
    every token is real."""
    if flat is not None:
        return torch.arange(tokens, device=flat[2].device) < flat[2].numel()
    if mask is None or mask.numel() != tokens:
        return None
    return mask


def _mask_hook(stats: RouterStats):
    def hook(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        stats.mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None

    return hook


def routers(model) -> list:
    """LFM2-MoE's router modules, in layer order."""
    return [m for m in model.modules() if type(m).__name__ == "Lfm2MoeTopKRouter"]


def attach(model, aux_coef: float, z_coef: float, accumulation: int) -> RouterStats | None:
    """Hooks the model's routers (None for a model without experts). The stats object is kept on the model as
    `_leap_router_stats` for the metrics callback."""
    config = getattr(model, "config", None)
    found = architecture(getattr(config, "model_type", None))
    gates = routers(model)
    if found is None or not found.moe or not gates:
        return None
    stats = RouterStats(aux_coef, z_coef, accumulation, gates[0].num_experts, len(gates))
    for layer, gate in enumerate(gates):
        gate.register_forward_hook(_router_hook(stats, layer))
    backbone = getattr(model, "model", model)
    backbone.register_forward_pre_hook(_mask_hook(stats), with_kwargs=True)
    stats.backbone = backbone
    model._leap_router_stats = stats
    return stats


def keep_expert_bias_fp32(model) -> int:
    """LFM2-MoE's expert bias (the load-balancing offsets added to the router scores before the top-k) back in
    float32 where the weights were loaded in bf16 (LoRA's bf16 base, bf16_kahan, QLoRA): in bf16 its small offsets
    round away and tokens go to other experts than the model chose in training (vLLM keeps it float32 too). The
    router's weight follows the model's dtype, as in vLLM. Returns how many were cast."""
    cast = 0
    for module in model.modules():
        bias = getattr(module, "expert_bias", None)
        if isinstance(bias, torch.Tensor) and bias.is_floating_point() and bias.dtype != torch.float32:
            module.expert_bias = bias.float()
            cast += 1
    return cast


def attach_from_training(model, training: dict) -> str | None:
    """Hooks a mixture-of-experts model's routers with the run's coefficients (and keeps the expert bias in
    float32); the line the run log prints (None for a model without experts)."""
    config = getattr(model, "config", None)
    aux = training.get("router_aux_loss_coef")
    source = "set" if aux is not None else "the model's own" if _carries_coef(config) else "default"
    aux = model_aux_loss_coef(config) if aux is None else float(aux)
    z = float(training.get("router_z_loss_coef") or 0.0)
    stats = attach(model, aux, z, int(training.get("gradient_accumulation_steps") or 1))
    if stats is None:
        return None
    keep_expert_bias_fp32(model)
    experts = getattr(config, "_experts_implementation", None) or "eager"
    return (
        f"mixture of experts: {stats.num_experts} experts, {getattr(config, 'num_experts_per_tok', '?')} per token, "
        f"{stats.layers} routed layers; load-balancing loss x {aux:g} ({source}), z-loss x {z:g}; experts run as "
        f"{experts}"
    )


def _carries_coef(config) -> bool:
    text = getattr(config, "text_config", None) or config
    return isinstance(getattr(text, "router_aux_loss_coef", None), (int, float))
