"""The fault points the tests kill at (leap_finetune/faults.py): POINT fires the first time, POINT#N the N-th
time, each entry of the variable once per value of it."""

from __future__ import annotations

import signal

from leap_finetune import faults


def test_each_entry_fires_at_its_reach(monkeypatch):
    got: list[tuple[str, int]] = []
    reach = {"now": ""}
    handlers = {
        sig: signal.signal(sig, lambda number, frame: got.append((reach["now"], number)))
        for sig in (signal.SIGUSR1, signal.SIGUSR2)
    }
    monkeypatch.setattr(faults, "_fired", set())
    monkeypatch.setattr(faults, "_reached", {})
    try:
        monkeypatch.setenv("LEAP_FINETUNE_FAULT", "a#2=SIGUSR1,a#3=SIGUSR2,b=SIGUSR1")
        for reach["now"] in ("a#1", "a#2", "a#3", "a#4", "b#1", "b#2"):
            faults.point(reach["now"].split("#")[0])
        assert got == [("a#2", signal.SIGUSR1), ("a#3", signal.SIGUSR2), ("b#1", signal.SIGUSR1)]
        got.clear()  # a new value of the variable counts afresh
        monkeypatch.setenv("LEAP_FINETUNE_FAULT", "a=SIGUSR2")
        for reach["now"] in ("a#1", "a#2"):
            faults.point("a")
        assert got == [("a#1", signal.SIGUSR2)]
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
