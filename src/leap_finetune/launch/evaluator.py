"""The driver's side of evaluation that does not pause training (`async_eval.mode: sidecar | reserved`).

Only the driver starts processes: rank 0 snapshots the model and reads the outcomes (evaluation/async_eval.py);
this thread of the driver picks each snapshot up (evaluation/handoff.py), runs its evaluation - an sbatch job
(evaluation/sidecar.py) or the evaluation server on the reserved GPUs and `leap-finetune eval --server` against
it (evaluation/reserved.py) - and writes the outcome beside the snapshot. One evaluation at a time, oldest step
first. When training ends the thread stops, and so does any evaluation still running (its server stopped, its
job cancelled): rank 0 has waited for what it wanted by then.
"""

from __future__ import annotations

import contextlib
import shutil
import threading

from leap_finetune.config.resolved import ResolvedConfig
from leap_finetune.evaluation import handoff
from leap_finetune.evaluation.snapshot import Outcome, Snapshot
from leap_finetune.runs.folder import RunFolder

POLL_S = 0.5


class DriverEvaluator:
    def __init__(self, resolved: ResolvedConfig, run_dir):
        from leap_finetune.evaluation.reserved import ReservedServer
        from leap_finetune.evaluation.sidecar import sidecar_job

        self.resolved = resolved
        self.snapshots = RunFolder(run_dir).benchmarks / "snapshots"
        self.jobs = RunFolder(run_dir).benchmarks / "jobs"
        self.run = sidecar_job if resolved.async_eval.mode == "sidecar" else ReservedServer(resolved, run_dir)
        self.closing = threading.Event()
        self.stop = handoff.StopAsked(self.closing, self.snapshots)
        self.thread = threading.Thread(target=self._loop, name="leap-eval", daemon=True)

    def start(self) -> None:
        # what a run killed earlier left (a resume): its snapshots were never evaluated, and rank 0 says so
        shutil.rmtree(self.snapshots, ignore_errors=True)
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.thread.start()

    def close(self) -> None:
        self.closing.set()
        self.thread.join()

    def _loop(self) -> None:
        while not self.closing.is_set():
            for snapshot in handoff.requests(self.snapshots):
                if self.stop.is_set():
                    break
                if handoff.claim(snapshot.folder, "evaluate"):
                    handoff.answer(snapshot.folder, self._evaluate(snapshot))
            self.closing.wait(POLL_S)

    def _evaluate(self, snapshot: Snapshot) -> Outcome:
        try:
            return self.run(self.resolved, snapshot, self.jobs, self.stop)
        except Exception as err:  # noqa: BLE001 - reported as a failed evaluation, never a stopped run
            return Outcome(reason=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")


@contextlib.contextmanager
def evaluating(resolved: ResolvedConfig, run_dir):
    """The driver's evaluator while the body (the training) runs; nothing for sync evaluation."""
    settings = resolved.async_eval
    if settings is None or settings.mode == "sync" or resolved.evals is None or not resolved.evals.benchmarks:
        yield None
        return
    evaluator = DriverEvaluator(resolved, run_dir)
    evaluator.start()
    try:
        yield evaluator
    finally:
        evaluator.close()
