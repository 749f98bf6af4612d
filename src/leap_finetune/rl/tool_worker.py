"""One tool worker: a process of its own (`python -m leap_finetune.rl.tool_worker`) that imports the environment's
tools once and runs their calls, so that a tool that hangs, leaks memory or crashes cannot take the training process
with it (rl/tool_workers.py starts, feeds and if need be kills it).

Protocol: JSON lines. The first line in says what to load ({source, timeout, memory_mb, max_chars}); the worker
answers {"ready": true} or {"ready": false, "error": ...}. Then each line in is a request - {"op": "reset",
"episodes": [[id, row], ...]}, {"op": "call", "calls": [[id, name, arguments], ...]}, {"op": "end", "episodes":
[ids]} - answered by one line. What the user's code prints goes to stderr (the protocol has stdout to itself).

Why a process and not a thread: Python cannot stop a thread, and a tool is user code. A call is stopped after
`timeout` by SIGALRM (the call's own state is kept); a call stuck in C code that ignores signals is the parent's to
kill. Memory: RLIMIT_AS set to what the import took plus `memory_mb`, so an allocation past it is a MemoryError the
model sees, not the machine's OOM killer.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def result_text(value, max_chars: int) -> str:
    """A tool's return value as the text of its `tool` turn: strings as they are, anything else as JSON."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > max_chars:
        text = text[:max_chars] + f"... [cut: {len(text) - max_chars} more characters]"
    return text


def _limited(function, timeout: float):
    """function() under the timeout: (value, None) or (None, error text)."""
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return function(), None
    except _Timeout:
        return None, f"error: the call did not finish within {timeout:g} s"
    except MemoryError:
        return None, "error: MemoryError (the tool ran out of its memory limit)"
    except (Exception, SystemExit, KeyboardInterrupt) as err:  # noqa: BLE001 - the user's tool: what the model sees
        return None, f"error: {type(err).__name__}: {err}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _limit_memory(memory_mb: int) -> None:
    try:
        import resource

        with open("/proc/self/status", encoding="ascii") as handle:
            size_kb = next(int(line.split()[1]) for line in handle if line.startswith("VmSize:"))
        limit = size_kb * 1024 + memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError, StopIteration, ImportError):  # (not Linux: no limit)
        pass


class Worker:
    def __init__(self, setup: dict):
        from leap_finetune.rl.tool_specs import ToolSource, load_toolbox

        self.timeout, self.max_chars = float(setup["timeout"]), int(setup["max_chars"])
        self.toolbox = load_toolbox(ToolSource.from_json(setup["source"]), where="environment.tools", describe=False)
        self.instances: dict = {}

    def reset(self, episode, row):
        instance, error = _limited(lambda: self.toolbox.new_instance(row, self.timeout), self.timeout)
        self.instances[episode] = instance
        return None if error is None else error.replace("error: ", "reset(row) failed: ", 1)

    def call(self, episode, name: str, arguments: dict) -> list:
        start = time.perf_counter()
        instance = self.instances.get(episode)
        value, error = _limited(lambda: self.toolbox.run(instance, name, arguments), self.timeout)
        text = error if error is not None else result_text(value, self.max_chars)
        return [text, error is None, time.perf_counter() - start]

    def end(self, episode) -> bool:
        instance = self.instances.pop(episode, None)
        close = getattr(instance, "close", None)
        if callable(close):
            _limited(close, self.timeout)
        return True


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # (the user's prints go to stderr: stdout is the protocol's)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (Ctrl-C reaches the process group: the trainer decides)
    signal.signal(signal.SIGALRM, _alarm)
    from leap_finetune.signals import die_with_parent

    die_with_parent(signal.SIGKILL, int(os.environ.get("LEAP_TOOL_PARENT", "0")) or None)

    def answer(message) -> None:
        protocol.write(json.dumps(message, ensure_ascii=False, default=str) + "\n")
        protocol.flush()

    setup = json.loads(sys.stdin.readline())
    try:
        worker = Worker(setup)
    except Exception as err:  # noqa: BLE001 - said to the parent, which raises it
        answer({"ready": False, "error": getattr(err, "message", str(err)), "fix": getattr(err, "fix", None)})
        return
    _limit_memory(int(setup["memory_mb"]))
    answer({"ready": True})
    operations = {"reset": worker.reset, "call": worker.call, "end": worker.end}
    for line in sys.stdin:
        request = json.loads(line)
        for item in request["items"]:  # (one answer per item, as soon as it is done: a crash loses only the rest)
            answer(operations[request["op"]](*item))


if __name__ == "__main__":
    main()
