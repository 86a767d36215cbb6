"""Kernel families. A family is a package here, `tuner/families/<name>/` (its space, reference,
inputs and checks), and a folder of templates, `templates/<name>/` (Jinja2 kernel templates, the
C ABI header, the torch binding sources). Adding both folders adds the family: it is found by
name, and no core module lists it.

Families can also live outside tuner: folders named in $TUNER_FAMILY_PATH (separated by
os.pathsep) hold more family packages, each with its templates in a `templates/` folder of its
own (or where its `TEMPLATES` attribute points)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
from pathlib import Path
from types import ModuleType

from tuner.errors import SpaceError


ENV_PATH = "TUNER_FAMILY_PATH"


def _search(folder: str | os.PathLike) -> str:
    folder = str(Path(folder).resolve())
    if folder not in __path__:
        __path__.append(folder)
    return folder


def add_path(folder: str | os.PathLike) -> None:
    """Find families in `folder` too (for this process and the processes it starts)."""
    folder = _search(folder)
    known = [p for p in os.environ.get(ENV_PATH, "").split(os.pathsep) if p]
    if folder not in known:
        os.environ[ENV_PATH] = os.pathsep.join(known + [folder])
    importlib.invalidate_caches()


def _from_environment() -> None:
    for folder in os.environ.get(ENV_PATH, "").split(os.pathsep):
        if folder:
            _search(folder)


def names() -> list[str]:
    """The families installed: the packages under tuner/families."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def get(name: str) -> ModuleType:
    """The family package by name, imported on first use, with the names it leaves to convention
    (`conventions`) filled in."""
    if name not in names():
        raise SpaceError(f"unknown kernel family {name!r}; known: {', '.join(names())}")
    module = importlib.import_module(f"{__name__}.{name}")
    if not getattr(module, "_conventions_applied", False):
        declared = getattr(module, "OP_DECLARATION", None) is not None
        for key, value in conventions(name, getattr(module, "TEMPLATES", None), declared).items():
            if not hasattr(module, key):
                setattr(module, key, value)
        module._conventions_applied = True
    return module


def conventions(name: str, own_templates=None, declared: bool = False) -> dict:
    """What a family named `name` need not declare, where its files follow the names below (in its
    templates folder): FAMILY, TEMPLATE `<name>.cu.j2`, HEADERS (`<name>_abi.h`, its C ABI, where
    it exists), ENTRY `tuner_<name>_vtable` (its variants' table, where it has an ABI), BINDING
    (`<name>_op.cpp`, its op in C++, where it exists), BINDING_HEADERS, OPS_NAMESPACE
    `tuner_<name>` (its control ops) and FAULTS (the faults `--plant-faults` may plant: none)."""
    try:
        folder = Path(own_templates) if own_templates else templates_root() / name
    except FileNotFoundError:  # an installation without templates: no files to find
        folder = Path(os.devnull)
    header, op = f"{name}_abi.h", f"{name}_op.cpp"
    has_header = (folder / header).is_file() or declared  # a declared op's header is written from it
    return {"FAMILY": name, "TEMPLATE": f"{name}.cu.j2", "HEADERS": (header,) if has_header else (),
            "ENTRY": f"tuner_{name}_vtable" if has_header else None,
            "BINDING": (op,) if (folder / op).is_file() else (), "BINDING_HEADERS": (),
            "OPS_NAMESPACE": f"tuner_{name}", "FAULTS": ()}


def part(name: str, module: str) -> ModuleType:
    """A module of a family's package, imported on first use. What core asks of each:
    `cli` (options, spaces, problem, bench), `evaluate` (Evaluation, for the worker), `op`
    (OP, the op's tuner.runtime.OpSpec), `bench` (its rows)."""
    get(name)
    try:
        return importlib.import_module(f"{__name__}.{name}.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}.{module}":
            raise
        raise SpaceError(f"kernel family {name!r} has no {module}.py yet: it cannot "
                         f"{_PURPOSE.get(module, 'do this')}") from exc


def has_part(name: str, module: str) -> bool:
    """Whether a family has a module `module` of its own."""
    return importlib.util.find_spec(f"{__name__}.{name}.{module}") is not None


_PURPOSE = {"cli": "be used from the command line", "evaluate": "be searched on a GPU",
            "op": "be loaded as an op", "bench": "be benchmarked"}


DEFAULT = "giou"  # the family a command works on when --family is not given


def templates_root() -> Path:
    """`templates/` of a source checkout, or the copy installed inside the package."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "templates", here / "templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("tuner's templates folder is missing from this installation")


def templates(name: str) -> Path:
    """A family's template folder: its `TEMPLATES`, else `templates/<name>/`."""
    own = getattr(get(name), "TEMPLATES", None)
    folder = Path(own) if own else templates_root() / name
    if not folder.is_dir():
        raise SpaceError(f"kernel family {name!r} has no templates folder {folder}")
    return folder


_from_environment()
