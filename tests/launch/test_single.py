"""One training process beside the driver (launch/single.py: the run on GPU machines where servers hold
some GPUs): the child trains the prepared run and hands back its summary, and a Ctrl-C to the driver
reaches the child once, so it saves a checkpoint and stops instead of dying."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import fact_rows, tiny_config, write_config, write_jsonl
from tests.watchdog import Watchdog, communicate, wait_until

# What run_config does up to the launch, then the child-process launch (on CPU: the plan of a GPU machine
# cannot be made here, the launch itself is the same).
DRIVER = """
import json, sys
from leap_finetune import api
from leap_finetune.launch.checks import prepare
from leap_finetune.launch.run_folder import write_run_folder
from leap_finetune.launch.devices import DevicePlan
from leap_finetune.launch.plan import plan_run
from leap_finetune.launch.single import run_in_child

resolved = api._config(sys.argv[1])
tokenizer, renderer, prepared = prepare(resolved)
plan = plan_run(resolved)
resolved = resolved.model_copy(update={"run_dir": str(plan.run_dir), "run_name": plan.run_name, "workers": 1})
write_run_folder(resolved, prepared, renderer, plan)
print("DRIVER", flush=True)
summary = run_in_child(json.loads(json.dumps(resolved.to_json_dict())), DevicePlan(nodes=1, gpus_per_node=0),
                       plan.run_dir)
print("SUMMARY " + json.dumps(summary), flush=True)
"""


@pytest.mark.slow
def test_the_child_trains_and_a_ctrl_c_to_the_driver_saves_a_checkpoint(workdir):
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    config = write_config(workdir, tiny_config(training_config={"max_steps": 300, "save_steps": 1000}))
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(config)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def trained_3_steps():
        found = list((workdir / "outputs" / "test").glob("*/metrics.jsonl"))
        return found[0] if found and found[0].read_text().count('"loss"') >= 3 else None

    metrics = wait_until(trained_3_steps, Watchdog(driver.pid, what="the driver and its child"), proc=driver)
    driver.send_signal(signal.SIGINT)  # to the driver only: the child runs in its own process group
    stdout, stderr = communicate(driver)
    assert driver.returncode == 0, stderr[-2000:]
    summary = json.loads(stdout.split("SUMMARY ", 1)[1])
    assert summary["stopped_by_signal"] == signal.SIGINT
    [checkpoint] = metrics.parent.glob("checkpoint-*")
    assert 3 <= int(checkpoint.name.split("-")[1]) == summary["global_step"] < 300
    assert (checkpoint / "leap_checkpoint_complete.json").exists()
    # the child's own lines (its model, its progress) are appended to the run's train.log by the child
    log = (metrics.parent / "train.log").read_text()
    assert "model: 898,944 parameters" in log and "training " in log and "\x1b[" not in log


@pytest.mark.slow
def test_a_mistake_the_child_finds_is_the_drivers_user_error(workdir):
    """A model folder without weights is found when the child loads the model: the driver raises the same
    LeapError (exit code 2 in the CLI), whatever exit code the child's libraries used."""
    from leap_finetune import api
    from leap_finetune.errors import LeapError
    from leap_finetune.launch.checks import prepare
    from leap_finetune.launch.devices import DevicePlan
    from leap_finetune.launch.plan import plan_run
    from leap_finetune.launch.run_folder import write_run_folder
    from leap_finetune.launch.single import run_in_child

    write_jsonl(workdir / "train.jsonl", fact_rows(8))
    resolved = api._config(write_config(workdir, tiny_config()))
    _, renderer, prepared = prepare(resolved)
    plan = plan_run(resolved)
    (workdir / "empty-model").mkdir()
    (workdir / "empty-model" / "config.json").write_text('{"model_type": "lfm2"}')
    resolved = resolved.model_copy(
        update={
            "run_dir": str(plan.run_dir),
            "run_name": plan.run_name,
            "workers": 1,
            "model_id": str(workdir / "empty-model"),
        }
    )
    write_run_folder(resolved, prepared, renderer, plan)
    with pytest.raises(LeapError) as info:
        run_in_child(
            json.loads(json.dumps(resolved.to_json_dict())), DevicePlan(nodes=1, gpus_per_node=0), plan.run_dir
        )
    assert str(workdir / "empty-model") in info.value.format()


KILLED_DRIVER = """
import json, sys
from pathlib import Path
from leap_finetune import api
from leap_finetune.launch.checks import prepare
from leap_finetune.launch.run_folder import write_run_folder
from leap_finetune.launch.devices import DevicePlan
from leap_finetune.launch.plan import plan_run
from leap_finetune.runs.processes import Server, ServerSpec
from leap_finetune.launch.single import run_in_child

port = int(sys.argv[2])
server = Server(ServerSpec("test server", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                           port, health_path="/"), Path(sys.argv[3]))
server.start()
server.wait_healthy()
resolved = api._config(sys.argv[1])
tokenizer, renderer, prepared = prepare(resolved)
plan = plan_run(resolved)
resolved = resolved.model_copy(update={"run_dir": str(plan.run_dir), "run_name": plan.run_name, "workers": 1})
write_run_folder(resolved, prepared, renderer, plan)
run_in_child(json.loads(json.dumps(resolved.to_json_dict())), DevicePlan(nodes=1, gpus_per_node=0), plan.run_dir)
"""


def _cmdline(process) -> list[str]:
    """(a short-lived child may exit between the listing and the question: not a failure of the test)"""
    import psutil

    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def _runs_module(cmdline: list[str], module: str) -> bool:
    """`python -m MODULE` after its exec. (Matching text anywhere would also match a fork of the driver before its
    exec - or a helper it forks - whose command line is the driver's own script, which names the module.)"""
    return any(a == "-m" and b == module for a, b in zip(cmdline, cmdline[1:]))


@pytest.mark.slow
def test_a_killed_driver_takes_its_server_and_training_child_with_it(workdir):
    """SIGKILL gives the driver no chance to clean up: the server and the training child it started get
    SIGTERM from the kernel (PR_SET_PDEATHSIG) and end; nothing is left holding a port or a GPU."""
    import socket

    import psutil

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    write_jsonl(workdir / "train.jsonl", fact_rows(48))
    config = write_config(workdir, tiny_config(training_config={"max_steps": 3000, "save_steps": 10000}))
    driver = subprocess.Popen(
        [sys.executable, "-c", KILLED_DRIVER, str(config), str(port), str(workdir / "server.log")],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog, started = Watchdog(driver.pid, what="the driver"), []
    while driver.poll() is None:  # both started (the child need not be training yet)
        watchdog.check()
        children = psutil.Process(driver.pid).children(recursive=True)
        commands = [_cmdline(p) for p in children]
        if any(_runs_module(c, "http.server") for c in commands) and any(
            _runs_module(c, "leap_finetune.launch.single") for c in commands
        ):
            time.sleep(1)  # (past its exec: the kernel's death signal is set before it)
            started = children
            break
        time.sleep(0.05)
    commands = [_cmdline(p) for p in started]
    assert any(_runs_module(c, "http.server") for c in commands) and any(
        _runs_module(c, "leap_finetune.launch.single") for c in commands
    ), (
        commands,
        driver.communicate()[1][-2000:] if driver.poll() is not None else "",
    )
    driver.kill()
    driver.wait()
    deadline = time.time() + 60
    while time.time() < deadline and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in started):
        time.sleep(0.1)
    left = [" ".join(p.cmdline()) for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left
    from leap_finetune.runs.processes import port_in_use

    assert not port_in_use("127.0.0.1", port)  # the server's port is free again
