"""`train.log` in the run folder: what the run printed, as plain text (no colour codes, no progress-bar
redraws), appended to by a resumed run.

The driver's stdout and stderr are wrapped while `run` works (the Ray workers' lines reach the driver's
streams and are kept with them); the training child of a one-GPU run wraps its own and appends to the same
file. What is printed before the run folder exists (config, data report) is held and written first.
"""

from __future__ import annotations

import io
import re
import sys
import threading
import time
from pathlib import Path

# CSI sequences (colours, cursor moves), OSC sequences (hyperlinks, titles)
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[=>]")


def plain(line: str) -> str:
    """A terminal line as a log line: colour codes removed, only the last state of a line redrawn with \\r."""
    line = ANSI.sub("", line)
    return line.rstrip("\r").rsplit("\r", 1)[-1].rstrip()


class _Tee(io.TextIOBase):
    def __init__(self, stream, log: TrainLog):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.add(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:  # rich keeps its colours and live displays on a terminal
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self):
        return getattr(self.stream, "encoding", "utf-8")

    def __getattr__(self, name):
        return getattr(self.stream, name)


class TrainLog:
    """Context manager: tees sys.stdout and sys.stderr; `attach(path)` starts writing the file."""

    def __init__(self, header: bool = True):
        self.header = header
        self.lock = threading.Lock()
        self.pending = ""
        self.held: list[str] = []
        self.file = None

    def __enter__(self) -> TrainLog:
        self.saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(sys.stdout, self), _Tee(sys.stderr, self)
        return self

    def attach(self, path: Path) -> None:
        with self.lock:
            self.file = Path(path).open("a", encoding="utf-8")
            if self.header:
                from leap_finetune import __version__

                self.file.write(
                    f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} leap-finetune {__version__}: {' '.join(sys.argv)}\n"
                )
            self.file.writelines(self.held)
            self.held = []
            self.file.flush()

    def add(self, text: str) -> None:
        with self.lock:
            self.pending += text
            if "\n" not in self.pending:
                return
            *lines, self.pending = self.pending.split("\n")
            out = [plain(line) + "\n" for line in lines]
            if self.file is None:
                self.held.extend(out)
            else:
                self.file.writelines(out)
                self.file.flush()

    def __exit__(self, *exc) -> None:
        sys.stdout, sys.stderr = self.saved
        with self.lock:
            if self.file is not None:
                if self.pending.strip():
                    self.file.write(plain(self.pending) + "\n")
                self.file.close()
                self.file = None
