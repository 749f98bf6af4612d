"""One training process on some of this machine's GPUs (GRPO's servers hold the others, or `ray.num_workers: 1`
on a machine of several): a child process that sees only its GPU.

Why a child: the GPUs a process can use are fixed when CUDA initialises, and the driver's libraries may
initialise it (a `torch.cuda.is_available()` anywhere) before training starts; measured on 2 H200s, an
in-process run then saw both GPUs and TRL refused DataParallel. The child gets CUDA_VISIBLE_DEVICES from
its start. It runs in its own process group: Ctrl-C or SIGTERM reach the driver, which passes them on (the
first makes the child save a checkpoint and stop, a second stops it at once, a third kills it); the child
also gets SIGTERM if the driver dies. The child reports how it ended in a file of its own (the run's
summary, or the user error it stopped on), so exit codes of libraries cannot be mistaken for ours.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from leap_finetune.errors import LeapError, RunFailed
from leap_finetune.launch.devices import DevicePlan, physical_ids
from leap_finetune.runs.folder import RunFolder
from leap_finetune.runs.processes import NO_MULTICAST, die_with_parent
from leap_finetune.signals import Stopped, handled

# what a process started by a launcher of its own would inherit and mistake for its place in a group
NOT_INHERITED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_in_child(payload: dict, devices: DevicePlan, run_dir: Path) -> dict:
    ids = physical_ids(devices.training)
    folder = Path(tempfile.mkdtemp(prefix="leap-run-"))
    (folder / "payload.json").write_text(json.dumps(payload), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update({"CUDA_VISIBLE_DEVICES": ids, **NO_MULTICAST})
    signals: list[int] = []
    child = None
    previous = {}

    def forward(signum, frame):
        signals.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGKILL if len(signals) >= 3 else signum)

    try:
        if threading.current_thread() is threading.main_thread():
            previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        child = subprocess.Popen(
            [sys.executable, "-m", "leap_finetune.launch.single", str(folder)], env=env, preexec_fn=die_with_parent
        )
        code = child.wait()
        outcome = _read(folder / "outcome.json")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if child is not None and child.poll() is None:  # the driver is leaving on an error of its own
            child.kill()
            child.wait()
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()
    if outcome.get("error"):
        raise LeapError(outcome["error"]["message"], where=outcome["error"]["where"], fix=outcome["error"]["fix"])
    if outcome.get("summary") is not None:
        return outcome["summary"]
    if outcome.get("stopped"):
        raise Stopped(outcome["stopped"]["signum"], outcome["stopped"]["when"])
    if signals:  # stopped by the user before the training process could say how it ended
        raise Stopped(signals[-1], "(the training process ended)")
    how = (
        f"was killed by signal {-code}"
        + (" (SIGKILL: often the system running out of memory)" if code == -signal.SIGKILL else "")
        if code < 0
        else f"exited with code {code}"
    )
    if not run_dir.is_dir():
        raise RunFailed(
            f"the training process (CUDA_VISIBLE_DEVICES={ids}) {how}: the run folder {run_dir} was deleted "
            "while it trained; start the run again"
        )
    raise RunFailed(
        f"the training process (CUDA_VISIBLE_DEVICES={ids}) {how}; its output is above. Complete "
        f"checkpoints in {run_dir}, if any, are intact: resume with "
        "training_config.resume_from_checkpoint: latest"
    )


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def main(folder: str) -> int:
    from leap_finetune.recipes import recipe

    folder = Path(folder)
    payload = json.loads((folder / "payload.json").read_text(encoding="utf-8"))
    from leap_finetune.launch.run_lock import watch_driver
    from leap_finetune.launch.train_log import TrainLog

    watch_driver(Path(payload["run_dir"]), payload.get("run_token"))  # (a SIGKILLed driver: stop at once)
    try:
        # (the driver passes its signals on: the same phases as an in-process run, leap_finetune/signals.py)
        with handled(), TrainLog(header=False) as log:  # (the driver's train.log: this process's lines, appended)
            log.attach(RunFolder(payload["run_dir"]).train_log)
            summary = recipe(payload["training_type"], to_train=True).train(payload)
    except LeapError as err:
        outcome = {"error": {"message": err.message, "where": err.where, "fix": err.fix}}
        (folder / "outcome.json").write_text(json.dumps(outcome), encoding="utf-8")
        return 2
    except Stopped as err:  # before training, or a second signal: stop at once
        outcome = {"stopped": {"signum": err.signum, "when": err.when}}
        (folder / "outcome.json").write_text(json.dumps(outcome), encoding="utf-8")
        return 128 + err.signum
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    (folder / "outcome.json").write_text(json.dumps({"summary": summary}, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
