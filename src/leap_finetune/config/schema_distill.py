"""`training_type: distill`: `teacher:` (the model distilled from) and the `distill:` block (recipes/distill.py,
docs/distillation.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from leap_finetune.config.schema_base import StrictModel, with_fix


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
    teacher_gpus: int = Field(
        default=0,
        ge=0,
        description="GPUs of this node kept out of training for the teacher: the driver serves it there (vLLM where "
        "installed, else leap-finetune's own server) before training starts, and the student reads the teacher's "
        "top `teacher_top_k` log-probs per token from it (docs/distillation.md). 0: the teacher loads beside the "
        "student on the training GPU (its whole distribution).",
    )
    teacher_port: int = Field(
        default=8300,
        ge=1,
        le=65535,
        description="teacher_gpus: the port of the teacher server the driver starts on this node (127.0.0.1).",
    )
    teacher_base_url: str | None = Field(
        default=None,
        min_length=1,
        description="A running OpenAI-compatible server that serves `teacher` and answers /v1/completions with "
        "`prompt_logprobs` (vLLM: vllm serve TEACHER --max-logprobs 20; leap-finetune's own: python -m "
        "leap_finetune.evaluation.serve TEACHER), e.g. http://gpu-node:8300/v1: the student reads the teacher's top "
        "`teacher_top_k` log-probs per token from it, and the teacher takes no memory of the training GPU.",
    )
    teacher_top_k: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="teacher_gpus / teacher_base_url: how many of the teacher's most likely tokens it sends per "
        "position; the target is the teacher's distribution over them, renormalised (forward_kl only; vLLM's "
        "default --max-logprobs is 20). The share of the teacher's probability they hold is logged as "
        "distill/teacher_top_k_mass.",
    )
    teacher_timeout_s: float = Field(
        default=120,
        gt=0,
        allow_inf_nan=False,
        description="teacher_gpus / teacher_base_url: the longest one scoring request may take before the run stops "
        "with an error naming the server.",
    )

    @model_validator(mode="after")
    def _beta_with_jsd(self):
        if "beta" in self.model_fields_set and self.loss != "jsd":
            raise ValueError(
                with_fix(f"beta weighs loss jsd's mixture; loss is {self.loss}", "remove beta, or set loss: jsd")
            )
        if "max_new_tokens" in self.model_fields_set and self.mode != "on_policy":
            raise ValueError(
                with_fix("max_new_tokens limits the answers mode on_policy samples; mode is offline", "remove it")
            )
        if self.teacher_gpus and self.teacher_base_url:
            raise ValueError(
                with_fix(
                    "teacher_gpus serves the teacher on this node's GPUs, and teacher_base_url names a server that "
                    "already serves it",
                    "keep one: teacher_gpus to have the run serve it, teacher_base_url for a server you run",
                )
            )
        if "teacher_port" in self.model_fields_set and not self.teacher_gpus:
            raise ValueError(
                with_fix(
                    "teacher_port is the port of the server teacher_gpus starts; teacher_gpus is 0",
                    "remove teacher_port, or set teacher_gpus",
                )
            )
        served = self.teacher_gpus > 0 or self.teacher_base_url is not None
        for key in ("teacher_top_k", "teacher_timeout_s"):
            if key in self.model_fields_set and not served:
                raise ValueError(
                    with_fix(
                        f"{key} applies to a served teacher (teacher_gpus or teacher_base_url); this teacher loads "
                        "beside the student and gives its whole distribution",
                        f"remove {key}, or serve the teacher (teacher_gpus / teacher_base_url)",
                    )
                )
        if served and self.loss != "forward_kl":
            raise ValueError(
                with_fix(
                    f"loss {self.loss} needs the teacher's probability of every token the student gives mass to, "
                    "and a served teacher sends its top teacher_top_k log-probs only",
                    "use loss: forward_kl with a served teacher, or load the teacher beside the student (remove "
                    "teacher_gpus / teacher_base_url)",
                )
            )
        if self.teacher_base_url is not None:
            _check_url(self.teacher_base_url)
        return self

    @property
    def served(self) -> bool:
        return self.teacher_gpus > 0 or self.teacher_base_url is not None


def _check_url(url: str) -> None:
    """An http(s) URL with a host and a valid port; credentials in it are refused without repeating them (the
    requests would not send them, and the message would print the password)."""
    from urllib.parse import urlsplit

    example = "the server's /v1 URL, e.g. http://127.0.0.1:8300/v1"
    if not url.startswith(("http://", "https://")):
        raise ValueError(with_fix(f"teacher_base_url is {url!r}: expected an http:// or https:// URL", example))
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            with_fix(
                "teacher_base_url holds a user name or password (user:password@host): they are not sent with the "
                "requests",
                f"give {example}, without them, on a network you trust",
            )
        )
    try:
        port = parts.port
    except ValueError:
        raise ValueError(
            with_fix(f"teacher_base_url is {url!r}: its port is not a number from 1 to 65535", example)
        ) from None
    if not parts.hostname or port == 0:
        raise ValueError(with_fix(f"teacher_base_url is {url!r}: expected a host and a port", example))
