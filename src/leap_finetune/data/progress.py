"""Rows checked / tokenized while the data step runs: a bar with rows/s and the time left on a terminal, a line
every 30 s in a log (SLURM, CI)."""

from __future__ import annotations

import time


class Progress:
    """Rows checked / tokenized, with rows/s and the time left: a bar on a terminal, a line every 30 s in
    a log (SLURM, CI). Silent for data that takes under two seconds."""

    def __init__(self, console, processes: int):
        self.console, self.processes = console, processes
        self.bar = None
        self.task = None
        self.done, self.total, self.label = 0, None, ""
        self.started = self.last_line = time.perf_counter()

    def __enter__(self) -> Progress:
        return self

    def start(self, label: str, total: int | None) -> None:
        self._line(final=True)
        self.label, self.total, self.done = label, total, 0
        self.started = self.last_line = time.perf_counter()
        if self.bar is not None:
            self.bar.update(self.task, description=label, total=total, completed=0)
            self.bar.reset(self.task, total=total, description=label)

    def advance(self, rows: int) -> None:
        self.done += rows
        now = time.perf_counter()
        if self.console is None or now - self.started < 2:
            return
        if self.console.is_terminal:
            if self.bar is None:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                self.bar = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.fields[speed]} rows/s"),
                    TimeRemainingColumn(),
                    console=self.console,
                    transient=True,
                )
                self.bar.start()
                self.task = self.bar.add_task(self.label, total=self.total, speed="")
            self.bar.update(self.task, completed=self.done, speed=f"{self._speed():,.0f}")
        elif now - self.last_line >= 30:
            self._line()

    def _speed(self) -> float:
        return self.done / max(1e-9, time.perf_counter() - self.started)

    def _line(self, final: bool = False) -> None:
        if self.console is None or self.console.is_terminal or not self.label or self.done == 0:
            return
        if final and self.last_line == self.started:  # never printed: short enough to stay quiet
            return
        self.last_line = time.perf_counter()
        left = "" if not self.total else f", {max(0, self.total - self.done) / max(1e-9, self._speed()):.0f} s left"
        of = f"/{self.total:,}" if self.total else ""
        self.console.print(
            f"data: {self.label}: {self.done:,}{of} rows ({self._speed():,.0f} rows/s, "
            f"{self.processes} process(es){left})"
        )

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
        elif exc[0] is None:
            self._line(final=True)
