"""Libraries a family's variants call for part of their work (a declaration's `libraries`), as
nvcc flags: where their headers are, and the shared library to link.

cuBLAS is found first in the NVIDIA wheel torch's own matmuls run on (`nvidia/cu13` or
`nvidia/cublas` in site-packages), then in the CUDA toolkit: a variant links the library by its
soname (`libcublas.so.13`), which the process has loaded with torch already, so an export needs
nothing installed beside torch. The CUDA 13 toolkit of the project's machines has no cuBLAS; the
wheel does."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path

from tuner.build import declared, toolkit
from tuner.errors import ToolchainError

# a library's header, shared library, and the header that holds its version
KNOWN = {"cublas": ("cublas_v2.h", "libcublas.so", "cublas_api.h")}


def linked(family: str) -> tuple[str, ...]:
    """The libraries a family's variants call (its op's declared `libraries`)."""
    op = declared.declaration(family)
    return tuple(op.libraries) if op is not None else ()


def _roots() -> list[Path]:
    """Where a library may be: the NVIDIA wheels' folders, then the toolkit."""
    found = []
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        found += [Path(location) / "cu13", Path(location) / "cublas"]
    try:
        found.append(toolkit.cuda_home())
    except ToolchainError:
        pass
    return found


@functools.cache
def find(name: str) -> tuple[Path, Path, str]:
    """(include folder, library folder, the library's file name) of a known library."""
    if name not in KNOWN:
        raise ToolchainError(f"no library {name!r} is known to the build; known: {', '.join(KNOWN)}")
    header, library, _ = KNOWN[name]
    for root in _roots():
        include = root / "include"
        if not (include / header).exists():
            continue
        for folder in (root / "lib", root / "lib64"):
            # the soname's file (libcublas.so.13), not a longer version's or the bare development link
            files = sorted(p.name for p in folder.glob(f"{library}.*") if p.name.count(".") == 2)
            if files:
                return include, folder, files[-1]
    raise ToolchainError(f"{name}: no {header} with its {library} beside torch's NVIDIA wheels or in the CUDA "
                         f"toolkit (looked in {', '.join(str(r) for r in _roots())}): pip install nvidia-{name}")


def flags(names) -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for the libraries `names` (the link flags go after the sources)."""
    compile_, link = [], []
    for name in names:
        include, folder, file = find(name)
        compile_.append(f"-I{include}")
        link += [f"-L{folder}", f"-l:{file}"]
    return compile_, link


@functools.cache
def key(names: tuple[str, ...]) -> str:
    """What of the libraries a build depends on: each one's library file and its version header's
    content (not where they are installed: a cache moved with its machine's Python stays valid)."""
    parts = []
    for name in names:
        include, _, file = find(name)
        digest = hashlib.sha256((include / KNOWN[name][2]).read_bytes()).hexdigest()[:16]
        parts.append(f"{name}:{file}:{digest}")
    return ";".join(parts)
