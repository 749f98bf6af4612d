"""The hand-off of asynchronous evaluations (evaluation/handoff.py) between rank 0 and the driver's evaluator
(launch/evaluator.py), on real files and threads. The evaluation itself - an sbatch job or the evaluation server,
run for real in tests/evaluation/test_async_eval_sidecar.py and test_async_eval.py - is replaced here by a function
the test controls, so that each fault can be put exactly where it matters: a claim race, an evaluation that raises,
a disk that refuses the answer, a stop while it runs, a driver that is gone."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from leap_finetune.evaluation import handoff
from leap_finetune.evaluation.snapshot import Outcome, Snapshot
from leap_finetune.launch.evaluator import DriverEvaluator
from leap_finetune.runs.folder import RunFolder


def _snapshot(snapshots: Path, step: int) -> Snapshot:
    folder = snapshots / f"step-{step}"
    (folder / "model").mkdir(parents=True)
    snapshot = Snapshot(step, "during training", folder, epoch=step / 10)
    handoff.describe(snapshot)
    return snapshot


def _until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def evaluator(tmp_path):
    """The driver's evaluator of a run folder (reserved mode), its evaluation replaced by `calls`' function."""
    resolved = SimpleNamespace(
        async_eval=SimpleNamespace(mode="reserved", reserved=SimpleNamespace(weight_reload="respawn")), eval_devices=""
    )
    driver = DriverEvaluator(resolved, tmp_path)
    driver.calls = []

    def run(_resolved, snapshot, jobs, stop):
        driver.calls.append(snapshot.step)
        return Outcome(results={"benchmark/x/score": snapshot.step / 100})

    driver.run = run
    yield driver
    if driver.thread.is_alive():
        driver.close()


def test_each_snapshot_is_evaluated_once_oldest_step_first(evaluator, tmp_path):
    evaluator.start()
    snapshots = RunFolder(tmp_path).snapshots
    later, earlier = _snapshot(snapshots, 20), _snapshot(snapshots, 10)
    _until(lambda: handoff.answered(later.folder) is not None)
    assert evaluator.calls == [10, 20]
    assert handoff.answered(earlier.folder).results == {"benchmark/x/score": 0.1}
    assert (earlier.folder / handoff.CLAIM).read_text() == "evaluate"
    time.sleep(3 * 0.5)  # a few more polls: nothing is evaluated twice
    assert evaluator.calls == [10, 20]


def test_a_snapshot_rank0_took_back_is_never_evaluated(evaluator, tmp_path):
    snapshots = RunFolder(tmp_path).snapshots
    taken_back = _snapshot(snapshots, 5)
    stale = handoff.requests(snapshots)  # the listing the driver holds while rank 0 takes the snapshot back
    assert [s.step for s in stale] == [5]
    assert handoff.claim(taken_back.folder, "cancel")
    handoff.remove(taken_back.folder)
    assert not handoff.claim(stale[0].folder, "evaluate")  # the driver can no longer take it...
    assert not taken_back.folder.exists()  # ...nor re-create the half-deleted folder with its claim file
    evaluator.start()  # (it clears what a killed run left: its snapshots were never evaluated)
    cancelled = Snapshot(6, "during training", snapshots / "step-6")
    (cancelled.folder / "model").mkdir(parents=True)
    assert handoff.claim(cancelled.folder, "cancel")  # taken back before the driver saw it, not yet removed
    handoff.describe(cancelled)
    later = _snapshot(snapshots, 7)
    _until(lambda: handoff.answered(later.folder) is not None)
    assert evaluator.calls == [7]
    assert (cancelled.folder / handoff.CLAIM).read_text() == "cancel"


def test_a_failing_evaluation_and_a_disk_that_refuses_the_answer_do_not_stop_the_evaluator(evaluator, tmp_path):
    snapshots = RunFolder(tmp_path).snapshots

    def run(_resolved, snapshot, jobs, stop):
        evaluator.calls.append(snapshot.step)
        if snapshot.step == 1:
            raise RuntimeError("the server process could not be started")
        return Outcome(results={"benchmark/x/score": 1.0})

    evaluator.run = run
    evaluator.start()
    failing = _snapshot(snapshots, 1)
    refused = _snapshot(snapshots, 2)
    (refused.folder / handoff.OUTCOME).mkdir()  # the answer cannot be written there (as on a full disk)
    _until(lambda: evaluator.calls == [1, 2])
    _until(lambda: handoff.answered(failing.folder) is not None)
    assert handoff.answered(failing.folder).reason == "RuntimeError: the server process could not be started"
    time.sleep(1.0)
    assert evaluator.thread.is_alive() and handoff.answered(refused.folder) is None
    (refused.folder / handoff.OUTCOME).rmdir()  # space again: the kept answer is written at the next poll
    _until(lambda: handoff.answered(refused.folder) is not None)
    assert handoff.answered(refused.folder).results == {"benchmark/x/score": 1.0}
    assert evaluator.calls == [1, 2]  # answered again, not evaluated again
    later = _snapshot(snapshots, 3)
    _until(lambda: handoff.answered(later.folder) is not None)


def test_stop_reaches_the_running_evaluation_and_it_answers(evaluator, tmp_path):
    snapshots = RunFolder(tmp_path).snapshots
    running = threading.Event()

    def run(_resolved, snapshot, jobs, stop):
        running.set()
        while not stop.is_set():
            time.sleep(0.05)
        return Outcome(reason="stopped (training ended)")

    evaluator.run = run
    evaluator.start()
    snapshot = _snapshot(snapshots, 4)
    assert running.wait(20)
    handoff.ask_to_stop(snapshots)  # rank 0: training stopped early
    _until(lambda: handoff.answered(snapshot.folder) is not None)
    assert handoff.answered(snapshot.folder).reason == "stopped (training ended)"
    evaluator.close()
    assert not snapshots.exists()  # the driver removes the hand-off folder, STOP included


def test_rank0_stops_waiting_for_a_driver_that_is_gone(evaluator, tmp_path, monkeypatch):
    monkeypatch.setattr(handoff, "HEARTBEAT_STALE_S", 1.5)
    snapshots = RunFolder(tmp_path).snapshots
    watch = handoff.DriverWatch(snapshots)
    assert not watch.alive()  # no driver has ever beaten
    evaluator.start()
    time.sleep(1.0)
    assert watch.alive()
    time.sleep(1.0)
    assert watch.alive()  # the counter keeps moving while the driver lives
    evaluator.closing.set()  # the driver stops beating (as a killed one would), its files stay
    evaluator.thread.join()
    evaluator.heart.join()
    time.sleep(2.0)
    assert not watch.alive()
