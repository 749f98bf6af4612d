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
    ("files", "faults", "quiet", "startup", "methods", "hub_access"),
    ("memo",),
    ("signals", "runs"),
    ("config",),
    ("data",),
    ("models", "rl", "memory"),
    ("validate",),
    ("evaluation",),
    ("recipes",),
    ("launch",),
    ("export", "chat"),
    ("gguf_export",),
    ("api",),
    ("cli_words", "cli_show"),
    ("cli", "__init__"),
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
# imports that run back up, each explained in docs/architecture.md ("Exceptions")
ALLOWED_UP: set[tuple[str, str]] = set()
# the modules that may compare row kinds (`rows == PAIR`): the row-kinds table itself
ROW_KIND_TABLES = {"methods/__init__.py", "data/row_kinds.py"}


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


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(PACKAGE.rglob("*.py"))]


def test_the_run_folder_entries_are_named_once():
    """runs/folder.py names metrics.jsonl, summary.json, model/, prepared/samples.json ...; everyone else asks
    RunFolder. Every entry name it declares (its upper-case string constants) is checked: a file name (with a dot)
    quoted anywhere else, any entry joined onto a path (`x / "model"`) anywhere else."""
    from leap_finetune.runs import folder

    entries = {
        value
        for name, value in vars(folder).items()
        if name.isupper() and isinstance(value, str) and value and name != "CHECKPOINT_PREFIX"
    } | set(folder.PREPARED_SPLITS)
    # (config.yaml is also the name `init` writes a user's new config to: only joined onto a path is it the run's)
    files = {e for e in entries if "." in e and e != folder.CONFIG_COPY}
    found = []
    for path, tree in _sources():
        if path == Path(folder.__file__):
            continue
        for node in ast.walk(tree):
            joined = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
            named = (
                joined
                and isinstance(node.right, ast.Constant)
                and node.right.value in entries
                or isinstance(node, ast.Constant)
                and node.value in files
            )
            if named:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], "ask runs.folder.RunFolder instead:\n" + "\n".join(found)


def test_training_types_and_row_kinds_are_compared_only_in_their_tables():
    """`kind == "embedding"` (whatever the variable's name) outside methods/, or `method.rows == PAIR` outside the
    row-kinds table, is a branch the next type would have to be added to: ask the type's Method, or its row kind."""
    names = set(leap_finetune.methods.TRAINING_TYPES)
    row_kinds = {"CONVERSATION", "PAIR", "LABELLED", "PROMPT", "TEXT_PAIR"}

    def type_name(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(type_name(e) for e in node.elts)

    def row_kind(node) -> bool:
        return (isinstance(node, ast.Name) and node.id in row_kinds) or (
            isinstance(node, ast.Attribute) and (node.attr == "rows" or node.attr in row_kinds)
        )

    found = []
    for path, tree in _sources():
        relative = path.relative_to(PACKAGE)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if relative.parts[0] != "methods" and any(type_name(side) for side in sides):
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
            if relative.as_posix() not in ROW_KIND_TABLES and any(row_kind(side) for side in sides):
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], "\n".join(found)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or inside a function (`from leap_finetune.recipes
    import common` is the module recipes.common; `from .x import name` the module x)."""
    modules = {"leap_finetune." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in PACKAGE.rglob("*.py")}
    modules = {m.removesuffix(".__init__") for m in modules}
    graph: dict[str, set[str]] = {}
    for source, target, _ in _imports():
        name = target if target in modules else target.rsplit(".", 1)[0]
        if name in modules and name != source:
            graph.setdefault(source, set()).add(name)
    return graph


def test_no_import_circle_between_files():
    """Inside a package too: two modules that import each other (even inside a function) are one module in two
    files, or a piece that belongs below both."""
    graph = _module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:  # (Tarjan's strongly connected components)
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            circle = []
            while not circle or circle[-1] != module:
                circle.append(stack.pop())
            if len(circle) > 1:
                circles.append(" <-> ".join(sorted(circle)))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert sorted(circles) == [], "a piece both modules need belongs below both (or the two are one module)"


# The size budget: a module of at most MODULE_LINES lines, a function (its nested functions included) of at most
# FUNCTION_LINES. Nothing is over it today (issue #46 cut 4 modules and 20 functions); an exception would be listed
# here with its reason, the lists may only shrink (an entry back within budget must leave them), and they never
# hold a module or more than 8 functions.
MODULE_LINES = 500
FUNCTION_LINES = 80
MODULES_OVER_BUDGET: set[str] = set()
FUNCTIONS_OVER_BUDGET: set[str] = set()


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for path, tree in _sources():
        relative = path.relative_to(PACKAGE).as_posix()
        modules[relative] = len(path.read_text(encoding="utf-8").splitlines())

        def walk(node, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        functions[name] = child.end_lineno - child.lineno + 1
                    walk(child, name + ".")
                else:
                    walk(child, prefix)

        walk(tree, f"{relative}:")
    return modules, functions


def test_the_size_budget():
    modules, functions = _sizes()
    over = {m for m, n in modules.items() if n > MODULE_LINES}
    long = {f for f, n in functions.items() if n > FUNCTION_LINES}
    problems = [
        f"{m}: {modules[m]} lines (budget {MODULE_LINES}): split it" for m in sorted(over - MODULES_OVER_BUDGET)
    ]
    problems += [
        f"{f}: {functions[f]} lines (budget {FUNCTION_LINES}): cut it" for f in sorted(long - FUNCTIONS_OVER_BUDGET)
    ]
    problems += [
        f"{m} is within budget now: remove it from MODULES_OVER_BUDGET" for m in sorted(MODULES_OVER_BUDGET - over)
    ]
    problems += [
        f"{f} is within budget now (or gone): remove it from FUNCTIONS_OVER_BUDGET"
        for f in sorted(FUNCTIONS_OVER_BUDGET - long)
    ]
    assert problems == [], "\n".join(problems)
    assert MODULES_OVER_BUDGET == set() and len(FUNCTIONS_OVER_BUDGET) <= 8
