"""KTO recipe: TRL's KTOTrainer on (prompt, completion, label) rows the driver has rendered and
tokenized. KTO estimates its KL term from mismatched pairs within a batch, which is why
`per_device_train_batch_size` must be > 1 (checked when the config loads)."""

from __future__ import annotations

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.recipes import common
from leap_finetune.recipes.dpo import run_preference


def config_class():
    from trl import KTOConfig

    return KTOConfig


def trainer_class():
    from trl import KTOTrainer

    class LeapKTOTrainer(KTOTrainer):
        """TRL re-tokenizes every dataset from text; ours arrive tokenized (see recipes/dpo.py).
        What TRL does after tokenizing is kept: the KL completions, built by rotating the
        completions by one within each batch of size per_device_train_batch_size."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            if "prompt_ids" not in dataset.column_names:
                return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            if self.calculate_KL:
                def add_kl_completion_ids(examples):
                    examples["KL_completion_ids"] = [examples["completion_ids"][-1]] + examples["completion_ids"][:-1]
                    return examples

                dataset = dataset.map(add_kl_completion_ids, batched=True, batch_size=args.per_device_train_batch_size)
            return dataset

    return LeapKTOTrainer


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    return common.common_arguments(resolved, run_dir=run_dir, has_eval=has_eval, cuda=cuda)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    return run_preference(resolved_json, callbacks, config_class(), trainer_class())
