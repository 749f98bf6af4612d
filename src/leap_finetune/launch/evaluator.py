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
import sys
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
        self.snapshots = RunFolder(run_dir).snapshots
        self.jobs = RunFolder(run_dir).eval_jobs
        self.run = sidecar_job if resolved.async_eval.mode == "sidecar" else ReservedServer(resolved, run_dir)
        self.closing = threading.Event()
        self.stop = handoff.StopAsked(self.closing, self.snapshots)
        self.unanswered: list[tuple[Snapshot, Outcome]] = []  # outcomes the disk refused: written again each poll
        self.thread = threading.Thread(target=self._loop, name="leap-eval", daemon=True)
        # the heartbeat rank 0 reads (an evaluation can run for minutes: the beat is not the loop's)
        self.heart = threading.Thread(target=self._beat, name="leap-eval-heartbeat", daemon=True)

    def start(self) -> None:
        # what a run killed earlier left (a resume): its snapshots were never evaluated, and rank 0 says so
        shutil.rmtree(self.snapshots, ignore_errors=True)
        self.jobs.mkdir(parents=True, exist_ok=True)
        handoff.beat(self.snapshots, 1)
        self.thread.start()
        self.heart.start()

    def close(self) -> None:
        self.closing.set()
        self.thread.join()
        self.heart.join()
        if hasattr(self.run, "close"):  # (the reserved server kept between snapshots: weight_reload in_place)
            self.run.close()
        shutil.rmtree(self.snapshots, ignore_errors=True)  # (rank 0 has taken every outcome it waited for)

    def _loop(self) -> None:
        while not self.closing.is_set():
            try:
                self._poll()
            except Exception as err:  # noqa: BLE001 - one bad poll (a file system error) must not end the evaluator
                print(f"leap-finetune: the evaluator skipped a poll: {type(err).__name__}: {err}", file=sys.stderr)
            self.closing.wait(POLL_S)

    def _beat(self) -> None:
        count = 1
        while not self.closing.wait(POLL_S):
            count += 1
            handoff.beat(self.snapshots, count)

    def _poll(self) -> None:
        self.unanswered = [(s, o) for s, o in self.unanswered if not handoff.answer(s.folder, o)]
        for snapshot in handoff.requests(self.snapshots):
            if self.stop.is_set():
                return
            if handoff.claim(snapshot.folder, "evaluate"):
                outcome = self._evaluate(snapshot)
                if not handoff.answer(snapshot.folder, outcome):
                    self.unanswered.append((snapshot, outcome))

    def _evaluate(self, snapshot: Snapshot) -> Outcome:
        import time

        start = time.monotonic()
        try:
            outcome = self.run(self.resolved, snapshot, self.jobs, self.stop)
        except Exception as err:  # noqa: BLE001 - reported as a failed evaluation, never a stopped run
            return Outcome(reason=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        if outcome.seconds is None:  # (the reserved server says how long without its start)
            outcome.seconds = time.monotonic() - start
        return outcome


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
