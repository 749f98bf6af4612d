"""The distillation step runs the student under the run's mixed precision.

The loss calls the student's decoder directly (its output layer runs in the chunked loss), which bypasses the
autocast accelerate puts around the model's forward; a float32 student then trained in float32 - twice the
activation memory and float32 matmuls (measured on an H100: 43.0 GiB against a predicted 22.4).
"""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

from leap_finetune.models.tiny import build_tiny_model, load_tiny_tokenizer
from leap_finetune.recipes.distill import hidden_states


@pytest.fixture
def bf16_accelerator():
    # (an earlier test in this process may have left accelerate's process-wide state set up without bf16)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    yield accelerator
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_the_students_layers_run_under_the_runs_bf16_autocast(bf16_accelerator):
    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    student, teacher = build_tiny_model("tiny-lfm2", tokenizer), build_tiny_model("tiny-lfm2", tokenizer)
    seen = {}

    for name, model in (("student", student), ("teacher", teacher)):
        model.model.layers[0].feed_forward.register_forward_hook(
            lambda module, args, out, name=name: seen.update({f"{name} mlp": out.dtype})
        )
    ids = torch.tensor([tokenizer.encode("the sky is blue")])
    student_hidden, teacher_hidden = hidden_states(bf16_accelerator, student, teacher, {"input_ids": ids})

    assert student.dtype == torch.float32  # (float32 master weights: the matmuls must still be bf16)
    # (the teacher runs as loaded: float32 here, bf16 on a GPU - outside the student's autocast)
    assert seen == {"student mlp": torch.bfloat16, "teacher mlp": torch.float32}
    assert student_hidden.requires_grad and not teacher_hidden.requires_grad


class _Fp16:
    """The accelerator's autocast of an fp16 run (accelerate has no fp16 on a CPU; torch's CPU autocast does)."""

    def autocast(self):
        return torch.autocast("cpu", dtype=torch.float16)


def test_an_fp16_run_with_a_bf16_teacher_computes_the_loss():
    """Was: under fp16 autocast the bf16 teacher's hidden states came out float32 and its bf16 output layer refused
    them (a dtype error at the first step of any fp16 distillation on a GPU)."""
    from leap_finetune.recipes.distill_loss import DistillLoss, chunked_loss

    tokenizer = load_tiny_tokenizer("tiny-lfm2")
    student = build_tiny_model("tiny-lfm2", tokenizer)
    teacher = build_tiny_model("tiny-lfm2", tokenizer).to(torch.bfloat16)
    ids = torch.tensor([tokenizer.encode("the sky is blue and the grass is green")])
    student_hidden, teacher_hidden = hidden_states(_Fp16(), student, teacher, {"input_ids": ids})
    targets = ids[0, 1:]
    total, _ = chunked_loss(
        DistillLoss(), student_hidden[0, :-1], teacher_hidden[0, :-1], student.lm_head, teacher.lm_head, targets
    )
    total.backward()
    assert torch.isfinite(total) and student.lm_head.weight.grad is not None
