"""Every name the tests reach through a module of the project exists. The GPU tests cannot run
here, so a name a change removed (a family's function moved to tests/references.py, say) would
fail only on a GPU host: each `module.name` read in any test file, and each `from module import
name`, is looked up here instead."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

TESTS = Path(__file__).parent
OURS = ("tuner", "references", "oploader", "simdata", "modes", "fakechild", "probe_ops")


def _ours(name: str) -> bool:
    return name.split(".")[0] in OURS


def _resolve(module: str, name: str):
    """`from module import name`: the submodule, or the module's attribute (AttributeError if neither)."""
    try:
        return importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return getattr(importlib.import_module(module), name)


def _missing(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, ModuleType] = {}
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name) and a.asname:
                    aliases[a.asname] = importlib.import_module(a.name)
                elif _ours(a.name) and "." not in a.name:
                    aliases[a.name] = importlib.import_module(a.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _ours(node.module):
            for a in node.names:
                try:
                    found = _resolve(node.module, a.name)
                except AttributeError:
                    missing.append(f"{path.name}:{node.lineno}: from {node.module} import {a.name}")
                    continue
                if isinstance(found, ModuleType):
                    aliases[a.asname or a.name] = found
    # a name the file also binds otherwise (a local `report = search.run(...)`) is not the module everywhere
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    bound |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    for name in bound:
        aliases.pop(name, None)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and not hasattr(aliases[node.value.id], node.attr)):
            missing.append(f"{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
    return missing


@pytest.mark.parametrize("path", sorted(TESTS.glob("test_*.py")), ids=lambda p: p.name)
def test_every_name_a_test_reads_from_the_project_exists(path):
    missing = _missing(path)
    assert not missing, missing


def test_a_removed_name_is_found(tmp_path):
    """The check itself: a read of a name the module lacks, and an import of one, are reported."""
    bad = tmp_path / "test_bad.py"
    bad.write_text("from tuner.families import embedding_bag as eb\nfrom tuner.runtime import no_such_thing\n"
                   "def test():\n    eb.reference_backward(1)\n    eb.make_inputs\n")
    assert _missing(bad) == ["test_bad.py:2: from tuner.runtime import no_such_thing",
                             "test_bad.py:4: eb.reference_backward"]
