"""The tool workers of a GRPO run with an `environment:`: processes (rl/tool_worker.py) that run the tools, fed by
the episode loop (rl/episodes.py) one turn at a time.

Each episode stays on one worker (episode i on worker i % workers), where its stateful environment instance lives;
the calls of one turn run in parallel across workers. A call that does not return within `tool_timeout` is stopped
in the worker (SIGALRM); a worker that does not answer even a grace period later (a call stuck in C code, a crash)
is killed and started again - its pending calls come back as errors, and the episodes that lived on it lose their
state (said to the model, counted as tool errors). Started as `python -m` with pipes, not multiprocessing: a spawned
multiprocessing child would import the user's `__main__` again.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass

from leap_finetune.errors import LeapError
from leap_finetune.rl.tool_specs import ToolSource

START_TIMEOUT_S = 120.0  # importing the tools in a fresh interpreter
GRACE_S = 5.0  # past a call's own timeout, before its worker is killed
LOST = object()  # no answer: the episode's environment died with its worker
DEAD = object()  # no answer: the worker hung on this item
EXITED = object()  # no answer: the worker's process ended while running this item (os._exit, a crash)


class WorkerDidNotStart(LeapError):
    """The tools' import ended the worker's process or never finished (validate tries it before importing here)."""


@dataclass
class Outcome:
    """One tool call's result as the model sees it, whether it ran without error, and its time."""

    text: str
    ok: bool
    seconds: float = 0.0


class ToolWorkers:
    def __init__(self, source: ToolSource, *, workers: int, timeout: float, memory_mb: int, max_chars: int):
        self.setup = {"source": source.to_json(), "timeout": timeout, "memory_mb": memory_mb, "max_chars": max_chars}
        self.timeout = timeout
        self.stateful = source.kind in ("class", "http")  # (http: one server session per episode)
        self.restarts = 0
        self._processes: list[subprocess.Popen | None] = [None] * workers
        self._buffers = [b""] * workers
        self._lost: set[int] = set()  # episodes whose environment died with its worker
        self._live: set[int] = set()
        for index in range(workers):  # (started together: each imports the tools in a fresh interpreter)
            self._spawn(index)
        for index in range(workers):
            self._await_ready(index)

    def __len__(self) -> int:
        return len(self._processes)

    # ---- processes ---------------------------------------------------------------------------------------------

    def _spawn(self, index: int) -> None:
        env = {**os.environ, "LEAP_TOOL_PARENT": str(os.getpid()), "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(
            # (-P: the current folder is not put first on sys.path - a user's json.py there would shadow the
            # standard library's in the worker)
            [sys.executable, "-P", "-m", "leap_finetune.rl.tool_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=False,
        )
        self._processes[index], self._buffers[index] = process, b""
        self._send(index, self.setup)

    def _await_ready(self, index: int) -> None:
        ready = self._read(index, time.monotonic() + START_TIMEOUT_S)
        if isinstance(ready, dict) and ready.get("ready"):
            return
        code = None
        if ready is EXITED:
            try:
                code = self._processes[index].wait(5)
            except subprocess.TimeoutExpired:
                pass
        self.close()
        if ready is EXITED or ready is DEAD:
            raise WorkerDidNotStart(
                "the environment's tools cannot be loaded in a tool worker: "
                + (
                    f"the process ended while they were imported (exit code {code}: os._exit(), a crash, or code "
                    "that ends the interpreter at the file's top level)"
                    if ready is EXITED
                    else f"importing them did not finish within {START_TIMEOUT_S:g} s (code at the file's top "
                    "level that waits: a server, input(), a loop)"
                ),
                where="environment.tools",
                fix="import the tools file with python to see where it stops: tools are imported in a process of "
                "their own, and the file's top level should only define them",
            )
        error = ready.get("error") if isinstance(ready, dict) else "the tool worker did not start"
        raise LeapError(
            f"the environment's tools cannot be loaded in a tool worker: {error}",
            where="environment.tools",
            fix=(ready.get("fix") if isinstance(ready, dict) else None)
            or "run `leap-finetune validate` on the config; the worker's error is above",
        )

    def _send(self, index: int, message) -> bool:
        try:
            self._processes[index].stdin.write((json.dumps(message, ensure_ascii=False, default=str) + "\n").encode())
            self._processes[index].stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def _read(self, index: int, deadline: float):
        """The worker's next answer, or DEAD when it died or did not answer by the deadline."""
        process = self._processes[index]
        fd = process.stdout.fileno()
        while b"\n" not in self._buffers[index]:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return DEAD
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return EXITED
            self._buffers[index] += chunk
        line, _, rest = self._buffers[index].partition(b"\n")
        self._buffers[index] = rest
        return json.loads(line)

    def _restart(self, index: int, why: str = "hung") -> None:
        print(
            f"leap-finetune: tool worker {index} {why} during a call"
            + (f" (past tool_timeout {self.timeout:g} s)" if why == "hung" else "")
            + "; starting it again",
            file=sys.stderr,
            flush=True,
        )
        process = self._processes[index]
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        self.restarts += 1
        if self.stateful:
            self._lost |= {e for e in self._live if e % len(self) == index}
        self._spawn(index)
        self._await_ready(index)

    # ---- requests ------------------------------------------------------------------------------------------------

    def _each(self, op: str, items: list[tuple]) -> dict:
        """Send each worker its items (item[0] is the episode), read one answer per item: {position: answer}. A
        worker that dies or hangs on an item is started again; that item's answer is DEAD, and the items after it are
        sent again - save those of episodes whose state died with it (no answer: the caller says they are lost)."""
        by_worker: dict[int, list[int]] = {}
        for position, item in enumerate(items):
            by_worker.setdefault(item[0] % len(self), []).append(position)
        for index, positions in by_worker.items():
            self._send(index, {"op": op, "items": [list(items[p]) for p in positions]})
        answers: dict = {}
        for index, positions in by_worker.items():
            while positions:
                answer = self._read(index, time.monotonic() + self.timeout + GRACE_S)
                answers[positions.pop(0)] = answer
                if answer is DEAD or answer is EXITED:
                    self._restart(index, "hung" if answer is DEAD else "exited")
                    positions = [p for p in positions if items[p][0] not in self._lost]
                    if positions:
                        self._send(index, {"op": op, "items": [list(items[p]) for p in positions]})
        return answers

    def reset(self, rows: list[dict]) -> list[str | None]:
        """Start episodes 0..len(rows)-1 (a stateful environment's reset(row)); per episode, why it could not."""
        self._live, self._lost = set(range(len(rows))), set()
        if not self.stateful:
            return [None] * len(rows)
        answers = self._each("reset", list(enumerate(rows)))
        found = [answers.get(e, LOST) for e in range(len(rows))]
        return [self._dead_text(a) if a is DEAD or a is LOST or a is EXITED else a for a in found]

    def call(self, calls: list[tuple[int, str, dict]]) -> list[Outcome]:
        """Run (episode, tool name, arguments) calls; one Outcome each, in order."""
        runnable = [position for position, call in enumerate(calls) if call[0] not in self._lost]
        answers = self._each("call", [calls[p] for p in runnable]) if runnable else {}
        by_position = {position: answers.get(slot, LOST) for slot, position in enumerate(runnable)}
        outcomes = []
        for position in range(len(calls)):
            answer = by_position.get(position, LOST)
            if answer is LOST:
                outcomes.append(Outcome("error: this episode's environment was lost when its worker restarted", False))
            elif answer is DEAD or answer is EXITED:
                outcomes.append(Outcome(self._dead_text(answer), False))
            else:
                outcomes.append(Outcome(*answer))
        return outcomes

    def _dead_text(self, answer=None) -> str:
        what = (
            "the tool's process exited during the call"
            if answer is EXITED
            else f"the tool did not return within {self.timeout:g} s and its process was stopped"
        )
        return f"error: {what}" + (" (the episode's environment state is lost)" if self.stateful else "")

    def end(self) -> None:
        """The batch's episodes are over: stateful instances dropped (their close() called)."""
        if self.stateful and self._live:
            self._each("end", [(e,) for e in sorted(self._live - self._lost)])
        self._live, self._lost = set(), set()

    def close(self) -> None:
        for process in self._processes:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
