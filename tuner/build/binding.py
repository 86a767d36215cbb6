"""A family's torch binding: its C++ sources (`BINDING` in templates/<family>/), built once per
torch/CUDA version with cpp_extension (in the per-user build cache) and loaded as a library of
torch ops. An export carries a copy of the built library (tuner/deploy/binaries.py).

A search does not need it (its variants are called directly: tuner/measure/kernel.py): it starts the
build in a process of its own (`build_in_background`), which goes on after the search ends, so
that the export that follows finds it built or waits for the rest. Builders take a lock that
ends with their process: a killed build never leaves the next one waiting.

    python -m tuner.build.binding FAMILY    builds FAMILY's binding (what the background build runs)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tuner import families, paths, runtime
from tuner.build import libraries, toolkit
from tuner.build.toolkit import torch_version
from tuner.build.render import header_text, templates_dir, write_headers
from tuner.errors import TunerError


def common_dir():
    """templates/common/: what every family's binding includes (tuner_binding.h)."""
    return families.templates_root() / "common"


def has_binding(family: str) -> bool:
    """Whether the family has an op in C++: hand-written (`BINDING`) or declared (`OP_DECLARATION`)."""
    fam = families.get(family)
    return bool(fam.BINDING) or getattr(fam, "OP_DECLARATION", None) is not None


def sources(family: str) -> dict[str, str]:
    """The binding's C++ sources, file name -> text: the op rendered from the family's declaration
    (`<family>_op.cpp`, tuner/build/declared.py), and its hand-written `BINDING` files."""
    from tuner.build import declared

    fam = families.get(family)
    op = declared.declaration(family)
    if op is None:
        return {f: (templates_dir(family) / f).read_text() for f in fam.BINDING}
    if f"{family}_op.cpp" in fam.BINDING:
        raise TunerError(f"family {family!r} declares its op and writes {family}_op.cpp too: keep one of the two")
    return {f"{family}_op.cpp": declared.op_source(op, family),
            **{f: (templates_dir(family) / f).read_text() for f in fam.BINDING}}


def _key(family: str) -> str:
    fam = families.get(family)
    source = "".join(sources(family).values())
    source += "".join((templates_dir(family) / f).read_text() for f in fam.BINDING_HEADERS)
    source += "".join(h.read_text() for h in sorted(common_dir().glob("*.h")))
    source += "".join(f.read_text() for f in _device_files(family))
    source += header_text(family)
    h = hashlib.sha256(f"{source}\0{torch_version()}\0{torch_cuda()}\0{toolkit.nvcc_version()}".encode())
    return h.hexdigest()[:16]


def torch_cuda() -> str | None:
    """`torch.version.cuda`, read from torch's version.py where it can be: a search checks its
    binding before it compiles, and importing torch takes seconds."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")
    folder = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
    try:
        text = (Path(folder) / "version.py").read_text() if folder else ""
    except OSError:
        text = ""
    found = re.search(r"^cuda\s*(?::[^=]*)?=\s*(None|'([^']*)'|\"([^\"]*)\")\s*$", text, re.MULTILINE)
    if found is None:
        import torch

        return torch.version.cuda
    return None if found.group(1) == "None" else (found.group(2) if found.group(2) is not None else found.group(3))


def _library_path(family: str) -> Path:
    key = _key(family)
    return paths.variants_dir() / "_binding" / key / f"tuner_{family}_binding_{key}.so"


def _done(path: Path) -> Path:
    """Written once the build of `path` has ended well: the linker writes the library in place, so
    a library without it may be half-written (a build under way, or one killed while linking)."""
    return path.with_name(path.name + ".done")


def built(family: str) -> Path | None:
    """The family's binding library where it is built already, else None (nothing is built)."""
    path = _library_path(family)
    return path if path.exists() and _done(path).exists() else None


@functools.lru_cache(maxsize=None)
def load(family: str, verbose: bool = False):
    """Build (first time only) and load a family's binding; returns its op namespace,
    `torch.ops.<family.OPS_NAMESPACE>`, or None for a family without one. Loading it also
    defines the ops it registers (the family's user-facing op and its CUDA and Autograd kernels).
    """
    if not has_binding(family):
        return None  # a family whose variants are called without a torch binding
    return runtime.load_binding(library(family, verbose), families.get(family).OPS_NAMESPACE)


def library(family: str, verbose: bool = False):
    """The built binding library of a family (built the first time: it includes
    torch/extension.h and so takes about a minute), cached under variants/_binding/<hash>/
    in the per-user cache, shared by every variant of the family and every TUNER_HOME;
    None for a family without one."""
    if not has_binding(family):
        return None
    found = built(family)
    if found is not None:  # built before: no torch, no ninja, no cpp_extension (milliseconds)
        return found
    path = _library_path(family)
    with _building(path.parent):  # another process's build of it: waited for
        if not _done(path).exists():
            _build(family, path, verbose)  # (ninja relinks a library a killed build left half-written)
            _done(path).touch()
    return path


@contextlib.contextmanager
def _building(build_dir: Path):
    """Hold the build folder's lock (fcntl: released when its holder ends, however it ends).
    cpp_extension's own lock file outlives a killed build and would keep every later one
    waiting; with this lock held no build is under way, so one found is stale and removed."""
    import fcntl

    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "tuner.lock", "w") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the torch binding that another process is building (a search starts it; "
                  f"its log: {build_dir / 'build.log'})", file=sys.stderr, flush=True)
            fcntl.flock(held, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        yield


def build_in_background(family: str) -> subprocess.Popen | None:
    """Start building a family's binding in a process of its own, at low priority, that outlives
    this one (its log: build.log beside the library); None where it is built or the family has none."""
    if not has_binding(family) or built(family) is not None:
        return None
    path = _library_path(family)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Below the search's own compiles (nice 10): the export needs the binding, the search's GPU its variants
    # (not preexec_fn: the search has threads)
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    with open(path.parent / "build.log", "ab") as log:
        return subprocess.Popen([*nice, sys.executable, "-m", "tuner.build.binding", family], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _device_files(family: str) -> list[Path]:
    """The device code a binding holds: the guard in front of torch's op, where its declaration has
    guards (templates/common/tuner_guard.cu)."""
    from tuner.build import declared

    op = declared.declaration(family)
    return [common_dir() / "tuner_guard.cu"] if op is not None and op.guards else []


def _build(family: str, path: Path, verbose: bool) -> None:
    build_dir = path.parent
    files = [templates_dir(family) / f for f in families.get(family).BINDING]
    from tuner.build import declared

    if declared.declaration(family) is not None:  # the op rendered from the declaration, kept beside the library
        rendered = build_dir / f"{family}_op.cpp"
        rendered.write_text(sources(family)[f"{family}_op.cpp"])
        files.insert(0, rendered)
    # the headers of the libraries its variants call (ATen's CUDA context, which hands the op their
    # handle, includes cuBLAS's)
    extra = [libraries.find(name)[0] for name in libraries.linked(family)]
    compile_library(path, files + _device_files(family), [write_headers(family, build_dir), templates_dir(family), *extra],
                    verbose)


def compile_library(path: Path, files: list[Path], includes: list[Path], verbose: bool = False,
                    optimize: bool = True) -> Path:
    """Build the library `path` (its folder: the build folder) of C++ `files` with cpp_extension,
    against torch and CUDA's headers, `includes` and templates/common; no GPU needed. `optimize=False`
    (-O0: a fifth less of a core's minute, for a test's probe op that is called, never timed)."""
    import torch

    toolkit.export_cuda_home()
    if not torch.cuda.is_available():
        # The binding holds no device code, but cpp_extension insists on an arch
        # list when it cannot read one off a GPU (e.g. building on a CPU machine).
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
    import logging

    # Its import says "No CUDA runtime is found" on a machine without a GPU, which builds bindings
    # (they hold no device code) as well as any: not a warning for the user.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        logger.setLevel(level)
    cpp_extension.CUDA_HOME = str(toolkit.cuda_home())  # in case it was imported before we set it
    cpp_extension.load(
        name=path.stem,
        sources=[str(f) for f in files],
        extra_include_paths=[*(str(i) for i in includes), str(common_dir())],
        extra_cflags=["-O2" if optimize else "-O0"],
        # device code (a guard) as PTX of the oldest architecture CUDA 13 has: one library for every
        # GPU, whatever the building machine has (an arch flag here keeps torch from adding its own)
        extra_cuda_cflags=["-O2" if optimize else "-O0", "-gencode=arch=compute_75,code=compute_75"],
        build_directory=str(path.parent),
        with_cuda=True,
        is_python_module=False,
        verbose=verbose,
    )
    return path


if __name__ == "__main__":
    import signal

    # A builder stopped with SIGTERM takes its compilers with it (its own process group: it leads a
    # session), so that the lock it gives up never lets a second build start beside a first one.
    signal.signal(signal.SIGTERM, lambda *_: (signal.signal(signal.SIGTERM, signal.SIG_DFL),
                                              os.killpg(0, signal.SIGTERM)))
    library(sys.argv[1], verbose=True)
