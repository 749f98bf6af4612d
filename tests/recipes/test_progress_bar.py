"""The training progress bar (recipes/callbacks.py RichProgress) with transformers' own TrainerState."""

from __future__ import annotations

import io

from rich.console import Console
from transformers import TrainerState

from leap_finetune.recipes.callbacks import RichProgress


def _bar_after(logs: list[dict]) -> str:
    out = io.StringIO()
    bar = RichProgress(Console(file=out, width=120, force_terminal=False))
    state = TrainerState(max_steps=4)
    bar.on_train_begin(None, state, None)
    for step, log in enumerate(logs, start=1):
        state.global_step = step
        bar.on_log(None, state, None, logs=log)
    bar.on_train_end(None, state, None)
    return out.getvalue()


def test_a_run_that_never_logged_a_step_shows_the_runs_mean_loss():
    """Was "loss - -" to the end when logging_steps is past the last step: the end's train_loss fills it."""
    text = _bar_after([{"train_loss": 1.25, "train_runtime": 1.0}])
    assert "mean loss 1.2500" in text and "loss -" not in text, text


def test_a_logged_reward_is_not_replaced_by_the_mean_loss_at_the_end():
    """GRPO's bar shows the reward (and the judge's failures); the run's mean policy loss must not replace it."""
    text = _bar_after([{"reward": 0.5, "judge/failures": 16, "judge/requests": 16}, {"train_loss": -0.0003}])
    assert "reward 0.500 (judge failed 16/16)" in text and "mean loss" not in text, text


def test_a_nan_reward_still_counts_as_shown():
    text = _bar_after([{"reward": float("nan"), "judge/failures": 16, "judge/requests": 16}, {"train_loss": 0.25}])
    assert "(judge failed 16/16)" in text and "mean loss" not in text, text


def test_a_mean_of_minus_zero_is_shown_as_zero():
    assert "mean loss 0.0000" in _bar_after([{"train_loss": -1e-9}])


def test_a_logged_loss_is_not_replaced_by_the_mean_at_the_end():
    text = _bar_after([{"loss": 2.5}, {"train_loss": 1.25}])
    assert "loss 2.5000" in text and "mean loss" not in text, text
