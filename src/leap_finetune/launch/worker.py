"""What each Ray Train worker runs: the recipe's `train(resolved_dict)`, the same function a
single-device run calls in-process."""

from __future__ import annotations


def train_worker(resolved_json: dict) -> None:
    from leap_finetune.recipes import recipe

    recipe(resolved_json["training_type"]).train(resolved_json)
