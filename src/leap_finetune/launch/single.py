"""One training process on some of this machine's GPUs (GRPO's servers hold the others, or `ray.num_workers: 1`
on a machine of several): a child process that sees only its GPU.

Why a child: the GPUs a process can use are fixed when CUDA initialises, and the driver's libraries may
initialise it (a `torch.cuda.is_available()` anywhere) before training starts; measured on 2 H200s, an
in-process run then saw both GPUs and TRL refused DataParallel. The child gets CUDA_VISIBLE_DEVICES from
its start. It runs in its own process group: Ctrl-C or SIGTERM reach the driver, which passes each one on
once (the first makes the child save a checkpoint and stop, a second stops it at once); the child also
gets SIGTERM if the driver dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from leap_finetune.errors import LeapError, RunFailed
from leap_finetune.launch.devices import DevicePlan, physical_ids
from leap_finetune.launch.distributed import NO_MULTICAST
from leap_finetune.launch.servers import _die_with_parent

USER_ERROR = 2  # the child's exit code for a LeapError (printed by the child)


def run_in_child(payload: dict, devices: DevicePlan, run_dir: Path) -> dict:
    ids = physical_ids(devices.training)
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="leap-run-", delete=False) as handle:
        json.dump(payload, handle)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ids, **NO_MULTICAST}
    child = subprocess.Popen([sys.executable, "-m", "leap_finetune.launch.single", handle.name], env=env,
                             preexec_fn=_die_with_parent)

    def forward(signum, frame):
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if child.poll() is None:  # the driver is leaving on an error of its own
            child.kill()
            child.wait()
        os.unlink(handle.name)
    if code == USER_ERROR:
        raise LeapError("the training process stopped on the error above", where=f"training process (GPU {ids})",
                        fix="correct what it names and run again")
    summary_path = run_dir / "summary.json"
    if code != 0 or not summary_path.exists():
        raise RunFailed(f"the training process (CUDA_VISIBLE_DEVICES={ids}) exited with code {code}; its output is "
                        f"above. The last complete checkpoint in {run_dir}, if any, is intact: resume with "
                        "training_config.resume_from_checkpoint: latest")
    return json.loads(summary_path.read_text(encoding="utf-8"))


def main(payload_path: str) -> int:
    from leap_finetune.recipes import recipe

    payload = json.loads(Path(payload_path).read_text(encoding="utf-8"))
    try:
        recipe(payload["training_type"]).train(payload)
    except LeapError as err:
        print(f"error: {err.format()}", file=sys.stderr)
        return USER_ERROR
    except KeyboardInterrupt:  # a second Ctrl-C: stop at once
        return 128 + signal.SIGINT
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
