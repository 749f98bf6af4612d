"""`optimizer_precision`: where the weights and AdamW's states live, and how small updates survive.

- `fp32` (the default): float32 master weights and states, bf16 autocast for the matmuls.
- `bf16_kahan`: weights and states in bf16 (half the optimizer's memory traffic, no per-step weight
  casts) with torch-optimi's AdamW and Kahan summation: each weight keeps a bf16 compensation buffer
  holding the part of its updates that bf16 cannot represent, so updates far below the weight's
  resolution (lr 1e-5 on weights of ~1e-2) still add up. Plain bf16 weights lose them: measured, the
  loss curve of bf16 weights left the float32 one within 4 steps (bench/NOTES.md).

The Trainer has no such optimizer (`optim` names only its own classes), so the class is handed to it
through `optimizer_cls_and_kwargs` with the Trainer's own learning rate, betas, epsilon and weight decay.
"""

from __future__ import annotations

from leap_finetune.config.precision import keeps_bf16_weights


def optimizer_cls_and_kwargs(precision: str | None, args):
    """(class, kwargs) for the Trainer's `optimizer_cls_and_kwargs`, or None for the Trainer's own AdamW."""
    if not keeps_bf16_weights(precision):
        return None
    from optimi import AdamW

    return AdamW, {
        "lr": args.learning_rate,
        "betas": (args.adam_beta1, args.adam_beta2),
        "eps": args.adam_epsilon,
        "weight_decay": args.weight_decay,
        "kahan_sum": True,
    }


def use_precision(trainer, precision: str | None) -> None:
    """Hand the trainer the optimizer of `precision` before it builds one (train() does, in create_optimizer). Set
    as the Trainer's attribute because TRL's DPO/KTO trainers do not take the constructor argument."""
    chosen = optimizer_cls_and_kwargs(precision, trainer.args)
    if chosen is not None:
        trainer.optimizer_cls_and_kwargs = chosen
