"""What each Ray Train worker runs: the recipe's `train(resolved_dict)`, the same function a
single-device run calls in-process, with a watch on the driver: a worker whose driver is gone stops at once
(launch/run_lock.py) instead of training on headless. A mistake of the user's found by a worker (a full disk, a
judge down for good) is handed to the driver as it is (WORKER_ERROR), which says it like any other."""

from __future__ import annotations

import json
from pathlib import Path

WORKER_ERROR = ".leap-worker-error-{rank}.json"  # in the run folder


def train_worker(resolved_json: dict) -> None:
    import os

    from leap_finetune.errors import LeapError
    from leap_finetune.launch.run_lock import watch_driver
    from leap_finetune.recipes import recipe

    run_dir = Path(resolved_json["run_dir"])
    watch_driver(run_dir, resolved_json.get("run_token"))
    try:
        recipe(resolved_json["training_type"], to_train=True).train(resolved_json)
    except LeapError as err:
        try:
            path = run_dir / WORKER_ERROR.format(rank=os.environ.get("RANK", "0"))
            path.write_text(json.dumps({"message": err.message, "where": err.where, "fix": err.fix}), encoding="utf-8")
        except OSError:  # (a full disk: the driver says what Ray reports)
            pass
        raise


def worker_error(run_dir: Path):
    """The LeapError a worker stopped on (the lowest rank's), removing the files; None when there is none."""
    from leap_finetune.errors import LeapError

    found = sorted(Path(run_dir).glob(WORKER_ERROR.format(rank="*")))
    error = None
    for path in found:
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
            error = error or LeapError(value["message"], where=value.get("where"), fix=value.get("fix"))
        except (OSError, ValueError, KeyError):
            pass
        path.unlink(missing_ok=True)
    return error
