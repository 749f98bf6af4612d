"""`training_config.report_to`: every tracker named must be one transformers knows and be installed,
checked at `validate` (transformers only finds out when the trainer starts, after the model loaded)."""

from __future__ import annotations

from leap_finetune.config.suggest import did_you_mean
from leap_finetune.errors import LeapError

# transformers' integration name -> the pip package that provides it
PACKAGES = {
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "trackio": "trackio",
    "mlflow": "mlflow",
    "comet_ml": "comet-ml",
    "neptune": "neptune",
    "clearml": "clearml",
    "dagshub": "dagshub",
    "codecarbon": "codecarbon",
    "azure_ml": "azureml-core",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
    "flyte": "flytekit",
    "kubeflow": "kubeflow",
}


def trackers(report_to) -> list[str]:
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    return [n for n in names if n != "none"]


def check_report_to(report_to, where: str) -> None:
    names = trackers(report_to)
    if not names:  # (nothing to check: transformers' integrations module costs seconds to import)
        return
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    known = sorted(INTEGRATION_TO_CALLBACK)
    available = set(get_available_reporting_integrations())
    for name in names:
        if name == "all":
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            hint = did_you_mean(str(name), known)
            raise LeapError(
                f"training_config.report_to names '{name}', which is not a tracker transformers knows",
                where=where,
                fix=(hint + " " if hint else "") + "expected none, all, or any of: " + ", ".join(known),
            )
        if name not in available:
            package = PACKAGES.get(name, name)
            raise LeapError(
                f"training_config.report_to names '{name}', but {package} is not installed here",
                where=where,
                fix=f"pip install {package} (wandb and tensorboard: pip install 'leap-finetune[trackers]'), "
                "or set report_to: none",
            )
