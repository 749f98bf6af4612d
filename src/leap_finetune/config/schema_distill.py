"""`training_type: distill`: `teacher:` (the model distilled from) and the `distill:` block (recipes/distill.py,
docs/distillation.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from leap_finetune.config.schema_base import StrictModel


class DistillConfig(StrictModel):
    """How the student learns from the teacher's next-token distributions."""

    loss: Literal["forward_kl", "reverse_kl", "jsd"] = Field(
        default="forward_kl",
        description="forward_kl: KL(teacher || student), the student covers every token the teacher thinks likely "
        "(classic distillation); reverse_kl: KL(student || teacher), the student settles on the teacher's main "
        "modes; jsd: the generalised Jensen-Shannon divergence between them, weighted by `beta` (as TRL's GKD).",
    )
    beta: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="loss jsd: the mixture's weight on the teacher (0 is forward_kl's direction, 1 reverse_kl's).",
    )
    temperature: float = Field(
        default=1.0,
        gt=0,
        allow_inf_nan=False,
        description="Both models' logits are divided by it before the softmax (above 1: softer distributions, "
        "more of the teacher's ranking of unlikely tokens); the loss is multiplied by temperature^2 so that its "
        "gradient keeps its scale.",
    )
    mode: Literal["offline", "on_policy"] = Field(
        default="offline",
        description="offline: on the dataset's assistant tokens (the rows and masks of SFT). on_policy: on "
        "answers the student samples at each step to the rows' prompts (the conversation up to the first answer; "
        "GKD), the teacher scoring them.",
    )
    max_new_tokens: int = Field(
        default=256,
        gt=0,
        description="on_policy: the longest answer the student samples (tokens; it stops at its end-of-turn token).",
    )
    mix: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="The share of the loss that is SFT's cross-entropy on the dataset's answers: "
        "(1 - mix) x divergence + mix x cross-entropy (on_policy: the divergence on the sampled answers, the "
        "cross-entropy on the rows' own).",
    )

    @model_validator(mode="after")
    def _beta_with_jsd(self):
        if "beta" in self.model_fields_set and self.loss != "jsd":
            raise ValueError(f"beta weighs loss jsd's mixture; loss is {self.loss} (remove beta or set loss: jsd)")
        if "max_new_tokens" in self.model_fields_set and self.mode != "on_policy":
            raise ValueError("max_new_tokens limits the answers mode on_policy samples; mode is offline")
        return self
