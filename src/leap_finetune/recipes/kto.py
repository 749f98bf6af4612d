"""KTO recipe: TRL's KTOTrainer on (prompt, completion, label) rows the driver has rendered and
tokenized. KTO estimates its KL term from mismatched pairs within a batch, which is why
`per_device_train_batch_size` must be > 1 (checked when the config loads)."""

from __future__ import annotations

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.methods import METHODS
from leap_finetune.recipes import dpo
from leap_finetune.recipes.dpo import run_preference


def config_class():
    """The training arguments of this type (methods/ names the class)."""
    return METHODS["kto"].arguments_class()


def trainer_class():
    from trl import KTOTrainer

    from leap_finetune.recipes.host_syncs import score_trained_tokens_only_on_cpu

    score_trained_tokens_only_on_cpu()  # (the prompt's positions: no log-prob needed)

    class LeapKTOTrainer(KTOTrainer):
        """TRL re-tokenizes every dataset from text; ours arrive tokenized (see recipes/dpo.py).
        What TRL does after tokenizing is kept: the KL completions, built by rotating the
        completions by one within each batch of size per_device_train_batch_size."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            if "prompt_ids" not in dataset.column_names:
                return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            if self.calculate_KL:
                batch = args.per_device_train_batch_size if dataset_name == "train" else args.per_device_eval_batch_size
                dataset = dataset.add_column("KL_completion_ids", kl_completions(dataset["completion_ids"], batch))
            return dataset

    return LeapKTOTrainer


def kl_completions(completions: list, batch_size: int) -> list:
    """TRL's KL pairing: the completions rotated by one within each batch of `batch_size` rows (the
    trainer reads batches in order), so each prompt meets another row's completion of its batch.

    Two changes from TRL 1.16, which rotates in batches of the *training* batch size for every split
    and so pairs a row with its own completion when a batch ends up with one row: the eval split is
    rotated in eval batches, and a last batch of one row takes the completion of the row before it."""
    pairs = []
    for start in range(0, len(completions), batch_size):
        chunk = completions[start : start + batch_size]
        if len(chunk) == 1 and start > 0:
            pairs.append(completions[start - 1])
        else:
            pairs.extend([chunk[-1]] + chunk[:-1])
    return pairs


def training_arguments(resolved: ResolvedConfig, *, run_dir: str, has_eval: bool, cuda: bool | None = None) -> dict:
    return dpo.training_arguments(resolved, run_dir=run_dir, has_eval=has_eval, cuda=cuda)  # (the same keys)


def train(resolved_json: dict, callbacks: list | None = None) -> dict:
    return run_preference(resolved_json, callbacks, config_class(), trainer_class())
