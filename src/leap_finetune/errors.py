"""One error type for user mistakes.

Everything a user can fix (bad YAML, unknown key, missing file, invalid rows) is raised as a
``LeapError`` carrying *where* (file, row, key) and *how to fix it*. The CLI prints it without a
traceback and exits with code 2. Any other exception is a bug in leap-finetune and may show one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class LeapError(Exception):
    """A mistake in the user's config or data."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None):
        self.message = message
        self.where = where
        self.fix = fix
        super().__init__(self.format())

    def format(self) -> str:
        lines = []
        lines.append(f"{self.where}: {self.message}" if self.where else self.message)
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)


class FolderTaken(LeapError):
    """A new run's folder was taken by another run between the plan and the rename into place (two runs started in
    the same second): an automatically named run takes the next free name (api.py)."""


class RunFailed(Exception):
    """A run that started and then failed (a worker died, ran out of memory): not a config mistake, so
    exit code 1, but one message (which process, why, what is intact) instead of a traceback."""


@dataclass(frozen=True)
class RowProblem:
    """One problem in one dataset row: enough to find it in the file and fix it."""

    file: str
    location: str  # "line 12" for JSONL, "row 3" otherwise
    field: str  # e.g. "messages[2].role"
    problem: str  # what was found and what was expected

    def format(self) -> str:
        return f"{self.file}, {self.location}, field '{self.field}': {self.problem}"

    def to_json(self) -> dict:
        return {"file": self.file, "location": self.location, "field": self.field, "problem": self.problem}


@dataclass
class DataError(LeapError):
    """Every invalid row of a dataset, reported at once (the first ``shown`` listed, plus a total)."""

    problems: list[RowProblem] = field(default_factory=list)
    total_rows: int = 0
    shown: int = 20
    fix_text: str = (
        "correct the rows listed above, or set `dataset.on_invalid: skip` to drop invalid rows "
        "(they are listed in the run folder's dropped_rows.jsonl)"
    )
    title: str = "dataset"

    def __post_init__(self) -> None:
        LeapError.__init__(self, self._message(), fix=self.fix_text)

    def _message(self) -> str:
        bad_rows = len({(p.file, p.location) for p in self.problems})
        head = (
            f"{len(self.problems)} problem(s) in {bad_rows} of {self.total_rows} {self.title} row(s)"
            if self.total_rows
            else f"{len(self.problems)} problem(s) in the {self.title}"
        )
        # The same problem in the same field of many rows is one line with the rows it affects.
        groups: dict[tuple[str, str, str], list[str]] = {}
        for p in self.problems:
            groups.setdefault((p.file, p.field, p.problem), []).append(p.location)
        listed = []
        for (file, field_name, problem), locations in list(groups.items())[: self.shown]:
            if len(locations) == 1:
                where = locations[0]
            else:
                more = f" and {len(locations) - 5} more" if len(locations) > 5 else ""
                where = f"{', '.join(locations[:5])}{more} ({len(locations)} rows)"
            listed.append(f"  - {file}, {where}, field '{field_name}': {problem}")
        if len(groups) > self.shown:
            rest = sum(len(locations) for locations in list(groups.values())[self.shown :])
            listed.append(f"  ... and {rest} more problem(s)")
        return "\n".join([head + ":", *listed])

    def __hash__(self) -> int:  # dataclass(eq=True) would make exceptions unhashable
        return id(self)
