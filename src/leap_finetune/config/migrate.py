"""`leap-finetune migrate OLD.yaml`: an original-system config (config/legacy.py) written in our keys, with a
comment above each key that changed and a header saying what was removed and what needs the user's decision.

The YAML is written anew from the converted mapping (PyYAML keeps no comments: the old file's own comments are
not carried; the header says so), atomically, never over an existing file without --force.
"""

from __future__ import annotations

import re
from pathlib import Path

from leap_finetune.config.legacy import Change, translate
from leap_finetune.config.yaml_io import dump_yaml, read_yaml
from leap_finetune.errors import LeapError

_ENTRY_LINE = re.compile(r"^(?P<indent> *)(?P<dash>- )")  # a list entry (one without a key counts too)
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<dash>- )?(?P<key>[^\s:#'\"-][^:#]*):(?: |$)")


def migrate(old: Path, output: Path | None, force: bool) -> tuple[Path, list[Change]]:
    """Write OLD's conversion (default: OLD.migrated.yaml beside it); the changes made."""
    raw = read_yaml(old)
    converted, changes = translate(raw)
    output = output or old.with_name(old.stem + ".migrated.yaml")
    if output.resolve() == old.resolve():
        raise LeapError(
            "migrate would write over the file it reads", where=str(output), fix="give --output another file name"
        )
    if output.exists() and not force:
        raise LeapError("the file exists", where=str(output), fix="choose another --output, or add --force")
    if output.suffix not in (".yaml", ".yml"):
        raise LeapError(f"a config is a YAML file, not '{output.suffix or output.name}'", where=str(output))
    from leap_finetune.files import write_atomic

    output.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(output, render(converted, changes, old))
    return output, changes


def render(converted: dict, changes: list[Change], old: Path) -> str:
    """The YAML text: a header, then the mapping with `# migrate:` above each key that is ours now."""
    header = [
        f"# Converted by `leap-finetune migrate` from {old.name} (the original system's format); the old file's "
        "own comments are not carried.",
    ]
    header += [f"# removed: {c.comment()}" for c in changes if c.new is None and not c.refused]
    header += [f"# NEEDS YOU: {c.comment()} -> {c.fix}" for c in changes if c.refused]
    if not changes:
        header.append("# nothing to convert: every key was already ours")
    lines = dump_yaml(converted).splitlines()
    where = _key_lines(lines)
    inserts: dict[int, list[str]] = {}
    for change in changes:
        if change.new is None or change.refused:
            continue
        line = _line_of(change.new, where)
        if line is None:
            header.append(f"# changed: {change.comment()}")
            continue
        indent = len(lines[line]) - len(lines[line].lstrip(" -"))
        inserts.setdefault(line, []).append(" " * indent + f"# migrate: {change.comment()}")
    out = list(header)
    for index, text in enumerate(lines):
        out += inserts.get(index, [])
        out.append(text)
    return "\n".join(out) + "\n"


def _key_lines(lines: list[str]) -> dict[str, int]:
    """Each key's dotted path -> its first line, twice: with each list entry's index ("dataset[1].split") and without
    ("dataset.split", the first entry's: what a change without an index is placed at)."""
    stack: list[tuple[int, str]] = []
    entries: dict[str, int] = {}  # a list's path -> the entries seen so far
    found: dict[str, int] = {}
    for index, text in enumerate(lines):
        match = _KEY_LINE.match(text) or _ENTRY_LINE.match(text)
        if not match:
            continue
        indent = len(match["indent"]) + (2 if match["dash"] else 0)
        while stack and stack[-1][0] >= (indent - 1 if match["dash"] else indent):
            stack.pop()
        if match["dash"]:  # a new entry of the list whose key is on the stack's top (PyYAML writes "- " at its indent)
            parent = _joined(stack)
            entries[parent] = entries.get(parent, -1) + 1
            stack.append((indent - 1, f"[{entries[parent]}]"))
        if match.groupdict().get("key") is None:  # a list entry that is a value ("- a.jsonl"): counted, no key
            continue
        stack.append((indent, match["key"].strip()))
        path = _joined(stack)
        found.setdefault(path, index)
        found.setdefault(re.sub(r"\[\d+\]", "", path), index)
    return found


def _joined(stack: list[tuple[int, str]]) -> str:
    return ".".join(key for _, key in stack).replace(".[", "[")


def _line_of(new: str, where: dict[str, int]) -> int | None:
    """The line of the key a change names ("retrieval.loss: mnrl", "slurm.partition/time, ...", "qat: {...}"),
    or of the nearest block above it that is written."""
    named = re.match(r"[\w.\[\]]*", new).group(0).strip(".")
    for path in (named, re.sub(r"\[\d+\]", "", named)):  # (the entry's own line first, then the first entry's)
        parts = path.split(".")
        for end in range(len(parts), 0, -1):
            line = where.get(".".join(parts[:end]))
            if line is not None:
                return line
    return None
