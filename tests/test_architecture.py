"""The house rules of docs/architecture.md, read from the source: the packages form layers (an import never runs
back up a layer, so there is no import circle), the training types are told apart only in methods/, and the run
folder's entries are named only in runs/folder.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import leap_finetune
import leap_finetune.methods

PACKAGE = Path(leap_finetune.__file__).parent

# Lowest first; a module may import its own layer and those below it (docs/architecture.md draws this).
LAYERS = [
    (
        "errors",
        "__version__",
    ),  # (`from leap_finetune import __version__`: a constant of the root, set before any import)
    ("files", "faults", "quiet", "methods"),
    ("signals", "runs"),
    ("config",),
    ("data",),
    ("models", "rl"),
    ("validate",),
    ("evaluation",),
    ("recipes",),
    ("launch",),
    ("export", "chat"),
    ("gguf_export",),
    ("api",),
    ("cli", "__init__"),
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
# imports that run back up, each explained in docs/architecture.md ("Exceptions")
ALLOWED_UP: set[tuple[str, str]] = set()


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports() -> list[tuple[str, str, int]]:
    """(importing module, imported module, line) for every import of the package by the package."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        module = "leap_finetune." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = [f"{target}.{alias.name}" for alias in node.names]  # (a name, or a module of the package)
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [(module, name, node.lineno) for name in names if name.startswith("leap_finetune.")]
    return found


def test_every_package_has_a_layer():
    units = {
        _unit("leap_finetune." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")
    }
    assert units - set(LAYER) == set(), "add the new package to LAYERS here and to docs/architecture.md"


def test_no_import_runs_back_up_a_layer():
    up = sorted(
        f"{source}:{line} imports {target}"
        for source, target, line in _imports()
        if LAYER[_unit(target)] > LAYER[_unit(source)] and (_unit(source), _unit(target)) not in ALLOWED_UP
    )
    assert up == [], "\n".join(up)


def test_no_import_circle_between_packages():
    graph: dict[str, set[str]] = {}
    for source, target, _ in _imports():
        if _unit(source) != _unit(target):
            graph.setdefault(_unit(source), set()).add(_unit(target))

    def reaches(start: str, goal: str, seen: set) -> bool:
        return any(
            n == goal or (n not in seen and not seen.add(n) and reaches(n, goal, seen)) for n in graph.get(start, ())
        )

    circles = sorted(f"{a} <-> {b}" for a in graph for b in graph[a] if reaches(b, a, set()))
    assert circles == []


def test_training_types_are_told_apart_only_in_methods():
    """`training_type == "grpo"` outside methods/ is a branch the next type would have to be added to."""
    names = "|".join(leap_finetune.methods.TRAINING_TYPES)
    compared = re.compile(
        rf"""training_type\s*(==|!=)\s*["']({names})["']|["']({names})["']\s*(==|!=)\s*\w*training_type"""
        rf"""|training_type\s+(not\s+)?in\s*[(\[{{]\s*["']({names})["']"""
    )
    found = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p in PACKAGE.rglob("*.py")
        if p.parent.name != "methods"
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if compared.search(line)
    ]
    assert found == []


def test_the_run_folder_entries_are_named_once():
    """runs/folder.py names metrics.jsonl, summary.json, model/, adapter/ ...; everyone else asks RunFolder."""
    from leap_finetune.runs import folder

    entries = [
        folder.METRICS,
        folder.SUMMARY,
        folder.RESOLVED_CONFIG,
        folder.TRAIN_LOG,
        folder.COMPLETIONS,
        folder.DROPPED_ROWS,
        folder.RESUME_CHANGES,
    ]
    quoted = re.compile(
        "|".join(rf"""["']{re.escape(e)}["']""" for e in entries)
        + r"""|/\s*["'](model|adapter|servers|plots|prepared)["']"""
    )
    found = [
        f"{p.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for p in PACKAGE.rglob("*.py")
        if p != Path(folder.__file__)
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if quoted.search(line)
    ]
    assert found == [], "\n".join(found)
