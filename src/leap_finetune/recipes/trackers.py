"""The trackers of `report_to` get the run as leap-finetune names it: the run folder's name as the run name,
`project_name` as the project (trackio's `project`, W&B's WANDB_PROJECT, MLflow's experiment), and the
resolved config (every value after profiles and defaults) next to the trainer's arguments they log themselves.

transformers' integrations log TrainingArguments and the model config; the config a user wrote is ours to add.
Adding it never stops training: a tracker that refuses is reported once.
"""

from __future__ import annotations

import json
import os

from transformers import TrainerCallback

from leap_finetune.config.trackers import trackers


def tracker_environment(resolved) -> None:
    """Defaults the integrations read from the environment (the user's own settings win)."""
    names = set(trackers(resolved.training.get("report_to")))
    if "wandb" in names or "all" in names:
        os.environ.setdefault("WANDB_PROJECT", resolved.project_name)
    if "mlflow" in names or "all" in names:
        os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", resolved.project_name)
    if ("tensorboard" in names or "all" in names) and resolved.run_dir:
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(resolved.run_dir, "tensorboard"))


class TrackerConfig(TrainerCallback):
    """On the main process, at the start of training (after the integrations started their runs: the Trainer's
    own callbacks come first): the resolved config into each tracker that runs."""

    def __init__(self, resolved, console):
        self.config = json.loads(json.dumps(resolved.to_json_dict(), default=str))
        self.names = set(trackers(resolved.training.get("report_to")))
        self.console = console

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero or not self.names:
            return
        every = "all" in self.names
        for name, send in (("tensorboard", self._tensorboard), ("wandb", self._wandb), ("mlflow", self._mlflow)):
            if name in self.names or every:
                try:
                    send(args)
                except ImportError:
                    continue  # ("all": a tracker that is not installed)
                except Exception as err:  # noqa: BLE001 - a tracker never stops training
                    self.console.print(
                        f"[yellow]note: the config could not be sent to {name} ({type(err).__name__}: {err})[/yellow]"
                    )

    def _tensorboard(self, args) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # an event file of its own in the run's TensorBoard folder: TensorBoard shows both files' data as one run
        with SummaryWriter(
            log_dir=os.environ.get("TENSORBOARD_LOGGING_DIR", os.path.join(args.output_dir, "tensorboard"))
        ) as writer:
            writer.add_text("leap_finetune/config", "```\n" + json.dumps(self.config, indent=2) + "\n```")

    def _wandb(self, args) -> None:
        import wandb

        if wandb.run is not None:
            wandb.run.config.update({"leap_finetune": self.config}, allow_val_change=True)

    def _mlflow(self, args) -> None:
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.log_dict(self.config, "leap_finetune_config.json")
