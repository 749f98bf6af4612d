"""Named points at which the tests interrupt a run for real: LEAP_FINETUNE_FAULT="POINT=SIGNAL[,POINT=SIGNAL]"
sends SIGNAL (SIGKILL, SIGTERM, SIGINT, SIGSTOP, ...) to this process when it reaches POINT, the first time (per
value of the variable); `POINT#N=SIGNAL` when it reaches POINT for the N-th time.

A kill "at a chosen point" needs no sleeping and no racing against a process from outside. The points:
`data-prep` (the driver, once the data workers are forked), `model-loading` (the training process, before the
model loads), `final-save` (the training process, the final model written but not yet in place),
`checkpoint-written` (a checkpoint's files written, its marker not yet), `checkpoint-deleting` (rotation: an old
checkpoint unmarked, its files not yet deleted), `checkpoint-saved` (a checkpoint marked and the old ones rotated
away: between saves), `gguf-written` (export --gguf: every file written and verified, not yet in place). Without the variable, each point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

_fired: set[tuple[str, str]] = set()  # (the variable's value, its entry): each entry fires once per value
_reached: dict[tuple[str, str], int] = {}  # (the variable's value, the point): how often reached


def point(name: str) -> None:
    spec = os.environ.get("LEAP_FINETUNE_FAULT")
    if not spec:
        return
    count = _reached[(spec, name)] = _reached.get((spec, name), 0) + 1
    for item in spec.split(","):
        where, _, signame = item.strip().partition("=")
        if where in (name, f"{name}#{count}") and (spec, where) not in _fired:
            _fired.add((spec, where))  # (so `X=SIGSTOP,X#3=SIGKILL` stops at the first and kills at the third)
            os.kill(os.getpid(), getattr(signal, signame or "SIGKILL"))
            return
