"""The core's layout: no import circles among tuner's modules (imports inside functions count: they
tie modules as surely), no stage of the pipeline importing a later one, no core module importing a
family (the core finds families through the registry, tuner.families, by name), and every import
of tuner naming what is there; no module over 400 lines. `pytest tests/test_layout.py` prints a
circle it finds."""

from __future__ import annotations

import ast
from pathlib import Path

import tuner

ROOT = Path(tuner.__file__).parent
FAMILIES = ROOT / "families"


def _in_a_family(path: Path) -> bool:
    """A family's own module (the registry, families/__init__.py, is the core's)."""
    return FAMILIES in path.parents and path != FAMILIES / "__init__.py"


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_name(p): p for p in ROOT.rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The tuner modules a file imports, anywhere in it (`from tuner import x` names module x
    where there is one, else the package)."""
    found = set()
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return {m for m in found if m in modules and m != _name(path)}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) for name, path in modules.items()}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, as the modules around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_tuners_modules_import_in_no_circle():
    circle = _circle(_graph())
    assert circle is None, " -> ".join(circle)


def test_no_core_module_imports_a_family():
    modules = _modules()
    family_modules = {m for m, p in modules.items() if _in_a_family(p)}
    offenders = {name: sorted(_imports(path, modules) & family_modules)
                 for name, path in modules.items() if not _in_a_family(path)}
    assert {k: v for k, v in offenders.items() if v} == {}


# The pipeline's stages, lowest first: a stage imports only those before it (tuner's other modules,
# the leaves, come first; the package's face, tuner/__init__ and __main__, and the families, which
# plug into every stage, are outside the order).
STAGES = ("build", "store", "measure", "search", "report", "deploy", "cli")


def _stage(module: str) -> int | None:
    parts = module.split(".")
    if module in ("tuner", "tuner.__main__") or parts[1] == "families":
        return None
    return STAGES.index(parts[1]) + 1 if parts[1] in STAGES else 0


def test_no_stage_imports_a_later_one():
    ups = [f"{a} -> {b}" for a, targets in _graph().items() for b in targets
           if _stage(a) is not None and _stage(b) is not None and _stage(b) > _stage(a)]
    assert ups == []


def test_the_check_finds_a_circle():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


def _defined(path: Path) -> set[str] | None:
    """The names a module defines at its top level (None where it answers any name: __getattr__)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # names defined under a guard count too
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return None if "__getattr__" in names else names


def test_every_import_of_tuner_names_what_is_there():
    """Imports in functions run only on the paths that reach them (some on a GPU alone): each
    `from tuner... import name` anywhere in the project names a module, or a name its module
    defines, and each `import tuner...` a module."""
    modules = _modules()
    files = [p for folder in ("tuner", "tests", "tools", "examples", "docs") for p in (ROOT.parent / folder).rglob("*.py")]
    missing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                missing += [f"{path.name}: import {a.name}" for a in node.names
                            if a.name.startswith("tuner") and a.name not in modules]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("tuner"):
                if node.module not in modules:
                    missing.append(f"{path.name}: from {node.module}")
                    continue
                defined = _defined(modules[node.module])
                for alias in node.names:
                    if f"{node.module}.{alias.name}" not in modules and defined is not None and alias.name not in defined:
                        missing.append(f"{path.name}: from {node.module} import {alias.name}")
    assert missing == []


def test_no_module_is_over_400_lines():
    """A module past 400 lines holds two things: split it where the design shows (docs/layout.md)."""
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_every_package_of_tuner_is_installed():
    """pyproject.toml names its packages one by one (templates/ goes in as tuner.templates): a
    package left out there, a new family's say, is missing from a non-editable install and from
    the wheels built from one."""
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {_name(p) for p in ROOT.rglob("__init__.py") if "__pycache__" not in p.parts}
    assert found <= listed, sorted(found - listed)
