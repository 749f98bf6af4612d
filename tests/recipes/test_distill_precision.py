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
    assert seen == {"student mlp": torch.bfloat16, "teacher mlp": torch.bfloat16}
    assert student_hidden.requires_grad and not teacher_hidden.requires_grad
