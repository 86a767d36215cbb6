"""The op runtime: an export's binaries bound to its family's op. Needs torch and nothing else.

`tuner.load` uses it, and every wheel that `tuner export-best --wheel` writes carries a copy
of this file (so it must import nothing from tuner). What it does:

- checks the binaries against the SHA-256 in the export's manifest, and the build identity
  (torch, CUDA, C++ ABI, Python, platform; the GPU architecture for the variants) against
  the running process;
- loads the family's torch binding (the op's schema, CUDA and Autograd kernels in C++), once
  per process: a second export of the same binding reuses the library already loaded;
- registers the family's CPU implementation (its float64 reference) and fake implementation
  (torch.compile), once per process;
- loads the winners' C tables (ctypes) and stages each in the binding with its tuned shape
  (`OpSpec.shape`; templates/common/tuner_op.h), which picks one per call in C++;
- the validate modes: how bad input that a kernel finds reaches the host.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import entries
from .entries import entry, functional  # noqa: F401 (what the families' functions call, as runtime.<name>)

VALIDATE = {"deferred": 0, "sync": 1, "async": 2}  # the bindings' codes
SERVES = {"inference": 1, "training": 2}  # the calls a staged variant serves, a bit each (tuner_op.h's Serves)
# The control ops a binding offers this runtime (templates/common/tuner_op.h); 4: stage(variant,
# int pair, int[] shape, int kind, str tuned_for[, int serves]), set_reach(pair, reach), publish(reference,
# reach), where variant 0 is the baseline (a binding of 4 before `serves` takes the rest: an export
# that gives torch's op one kind of call is newer than it). Binaries built for another protocol are not bound.
OP_PROTOCOL = 4
MANIFEST = "manifest.json"


class KernelInputError(ValueError):
    """A kernel's validation flagged the inputs (e.g. num_boxes or indices out of range)."""


class BuildMismatch(ImportError):
    """An export's binaries were built for another torch, CUDA, Python, platform or GPU."""

    def __init__(self, message: str, differences: list[str]):
        super().__init__(message)
        self.differences = differences


@dataclass
class OpSpec:
    """What a family's op hands the runtime (its `OP` in tuner/families/<name>/op.py)."""

    family: str
    op: str                         # the user's op in torch.ops.tuner, e.g. "<family>_loss"
    namespace: str                  # the binding's own ops (stage, publish, ...), "tuner_<family>"
    abi: int                        # the variants' C table ABI (first two fields: int abi, char* name)
    impls: dict[str, tuple[Callable, Callable]]  # op in tuner:: -> (CPU implementation, fake)
    # A winner's tuned problem as the binding compares it with a call: (sizes, kind), e.g.
    # ([rows, width], 0); a call runs the winner nearest in log distance, of its kind if any.
    shape: Callable[[dict], tuple[list[int], int]]
    extras: dict[str, Callable] = field(default_factory=dict)  # more public names (a wheel exports them)
    # The baseline: the op's C++ serves a call with the torch op the family replaces where no variant
    # beat it, where the call's dtype pair was not tuned (unless `untuned_by_baseline` is False: then
    # the tuned pairs' parameters are bound for it), and farther than `reach` (log distance, as
    # `shape` is compared; 0: no limit) from every tuned problem. `pair(problem)`: the index of its
    # dtype pair, as the C++ numbers them. Without one, the nearest winner serves every call.
    baseline: bool = False
    reach: float = 0.0
    pair: Callable[[dict], int] | None = None
    untuned_by_baseline: bool = True
    # `unfused(problem)`: whether torch's op has no fused kernel for the problem's dtypes (RMSNorm's
    # float32 weight over 16-bit x): there a variant serves every shape (no reach), and an untuned
    # pair the nearest tuned problem's parameters rendered for it.
    unfused: Callable[[dict], bool] | None = None
    # A declared op's (tuner/opspec.py): its float64 reference and the torch op it replaces, in
    # Python (the search checks against the one and times the other).
    reference: Callable | None = None
    torch_op: Callable | None = None


@dataclass
class Loaded:
    spec: OpSpec
    ops: Any                        # torch.ops.<namespace>
    bound: list[dict]               # the winners, in the order they were staged
    reference: bool                 # CUDA calls served by the CPU reference
    libraries: list = field(default_factory=list)  # the ctypes handles the tables point into


_loaded: dict[str, Loaded] = {}  # family -> what this copy of the runtime bound last


# ----------------------------------------------------------------- identity and checks

@functools.cache
def dtypes(names: tuple[str, ...]) -> frozenset:
    """The torch dtypes of names such as ("float32", "bfloat16"): what the ops' torch signatures
    test a call's tensors against, made once."""
    import torch

    return frozenset(getattr(torch, n) for n in names)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_checksum(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def identity() -> dict[str, Any]:
    """What a binding built here depends on (the variants: the arch and CUDA alone)."""
    import torch

    return {"op_protocol": OP_PROTOCOL, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "platform": sysconfig.get_platform()}


def attached_arch() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def differences(built: dict, arch: str | None) -> list[str]:
    """What differs between the identity binaries were built for and this process ("torch
    2.11.0+cu130 here, 2.10.0 in the export", ...); the arch only when a GPU is attached."""
    here = identity()
    out = [f"{k} {here[k]} here, {built.get(k)} in the export" for k in here if built.get(k) != here[k]]
    if arch is not None and built.get("arch") != arch:
        out.append(f"GPU architecture {arch} here, {built.get('arch')} in the export")
    return out


def read_manifest(directory: Path) -> dict:
    """An export's manifest with its checksum checked, and its binaries' SHA-256 (not sources)."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:  # the message says it all: no chained traceback of the missing file
        raise RuntimeError(f"{directory} is not a tuned export: no {MANIFEST} (make one with `tuner export-best`)") from None
    except OSError as exc:  # a folder where the manifest or the export should be, no permission
        raise RuntimeError(f"{directory} is not a tuned export: {path}: {exc.strerror}") from None
    except ValueError as exc:  # not JSON, not UTF-8
        raise RuntimeError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:  # nested past Python's stack: no export writes that
        raise RuntimeError(f"{path} is not valid JSON: nested too deeply") from None
    if not isinstance(manifest, dict):
        raise RuntimeError(f"{path} is not an export's manifest (a JSON object)")
    if manifest.get("checksum") != manifest_checksum(manifest):
        raise RuntimeError(f"{path} was edited after export (its checksum does not match); refusing to load it")
    check_binaries(Path(directory), manifest)
    return manifest


def check_binaries(directory: Path, manifest: dict) -> None:
    binaries = manifest.get("binaries")
    if not binaries:
        return
    try:
        files = {binaries["binding"]["file"]: binaries["binding"]["sha256"]} if binaries.get("binding") else {}
        files.update(binaries["libraries"])
        if not isinstance(binaries["identity"], dict):
            raise TypeError
    except (KeyError, TypeError, AttributeError, ValueError):
        raise RuntimeError(f"{directory / MANIFEST}: its binaries are not described as an export writes them") from None
    for name, expected in files.items():
        path = directory / name
        if not path.exists():
            raise RuntimeError(f"export {directory} is missing {name}")
        if not path.is_file():
            raise RuntimeError(f"export {directory}: {name} is not a file")
        if sha256_file(path) != expected:
            raise RuntimeError(f"{path} does not match the hash in {MANIFEST}: it was edited after export; "
                               "refusing to load it")


# ----------------------------------------------------------------- loading and binding

def load_binding(path: Path, namespace: str):
    """Load a binding library once per process. Another copy of the same build (same file
    name: it carries the hash of its sources and toolchain) is not loaded again; a different
    build of the same family's binding cannot share a process with it."""
    import torch

    path = Path(path)
    loaded = {Path(p).name: p for p in torch.ops.loaded_libraries}
    if path.name not in loaded:
        prefix = path.name.rsplit("_", 1)[0] + "_"
        other = [p for name, p in loaded.items() if name.startswith(prefix)]
        if other:
            raise RuntimeError(f"another build of this op's binding is loaded in this process ({other[0]}); "
                               f"{path} cannot be loaded beside it: use one tuner and one export per process")
        torch.ops.load_library(str(path))
    return getattr(torch.ops, namespace)


def torch_path(family: str) -> Callable | None:
    """The loaded op's own path to torch's op, whatever the bound table says (the baseline behind
    the declaration's guards, `torch.ops.tuner_<family>.baseline`): what a call costs where torch's
    op serves it; None where the op has no baseline or its binding predates this function."""
    import torch

    spec = loaded(family).spec
    if not spec.baseline:
        return None
    try:
        return getattr(torch.ops, spec.namespace).baseline
    except (AttributeError, RuntimeError):
        return None


def register_python(spec: OpSpec) -> None:
    """The CPU and fake implementations of the C++-defined ops, once per process (a second copy
    of the runtime, e.g. a wheel's beside tuner's, finds them registered and leaves them)."""
    import torch

    for name, (cpu, fake) in spec.impls.items():
        qualified = f"tuner::{name}"
        if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU"):
            continue
        lib = torch.library.Library("tuner", "IMPL")
        _LIBS.append(lib)
        torch.library.impl(qualified, "CPU", lib=lib)(cpu)
        torch.library.register_fake(qualified, lib=lib)(fake)


_LIBS: list = []  # keeps the torch.library.Library objects alive


class _Head(ctypes.Structure):
    _fields_ = [("abi", ctypes.c_int), ("name", ctypes.c_char_p)]


def table(library, entry: str, abi: int, expected: str | None = None) -> int:
    """The address of a variant's C table in a loaded library (ctypes.CDLL), checked: its C ABI,
    and that it holds the `expected` variant."""
    fn = getattr(library, entry)
    fn.restype = ctypes.c_void_p
    address = fn()
    head = _Head.from_address(address)
    name = head.name.decode()
    if head.abi != abi:
        raise RuntimeError(f"{library._name}: variant {name} has C ABI {head.abi}, this op needs {abi}; "
                           "export it again")
    if expected is not None and name != expected:
        raise RuntimeError(f"{library._name}: {entry} holds variant {name}, not {expected}")
    return address


def bind(spec: OpSpec, binding: Path, bound: list[dict], libraries: dict[str, Path], *, validate: str = "async",
         reference: bool = False, baseline: bool = True):
    """Load the binding, register the Python side and hand the winners to the op.

    `bound`: the winners in the order the binding gets them, each with `library` (a key of
    `libraries`), `entry` (its table's C name) and `variant`, and its `problem` (what `spec.shape` reads);
    or, where the baseline serves a problem, `served_by` "torch" and its `problem`. `baseline=False`:
    every call of a dtype pair with a variant runs the nearest one, even where torch's op was faster
    (a comparison, a test of the variants); torch's op serves only the pairs without one.
    """
    import torch

    if validate not in VALIDATE:
        raise ValueError(f"validate must be one of {tuple(VALIDATE)}: 'async' raises on a later call without "
                         "syncing, 'sync' raises at once (a sync per call), 'deferred' at check_errors()")
    ops = load_binding(binding, spec.namespace)
    entries.bind(binding, spec.op)
    ops.set_error_module(__name__)  # the C++ raises this module's KernelInputError
    register_python(spec)
    handles = []
    if torch.cuda.is_available():
        if not reference:
            handles = stage(spec, ops, staged(bound, baseline), libraries)
        ops.publish(reference, spec.reach if spec.baseline and baseline else 0.0)
        ops.set_check(VALIDATE[validate])
    _loaded[spec.family] = Loaded(spec, ops, bound, reference, handles)
    return entries.loaded(spec.op)


def staged(bound: list[dict], baseline: bool) -> list[dict]:
    """The binds a load stages: all of them; `baseline=False`, the variants' alone, each serving
    every call of its shape, of either kind (no `torch_serves`)."""
    if baseline:
        return list(bound)
    return [{k: v for k, v in b.items() if k != "torch_serves"} for b in bound if b.get("served_by") != "torch"]


def stage(spec: OpSpec, ops, bound: list[dict], libraries: dict[str, Path]) -> list:
    """Open the variant libraries and stage every winner's C table (the binding's `publish`
    makes them live); returns the library handles, which must stay alive while they are bound."""
    opened = {name: ctypes.CDLL(str(path)) for name, path in libraries.items()}
    for b in bound:
        sizes, kind = spec.shape(b["problem"])
        if spec.unfused is not None and spec.unfused(b["problem"]):
            ops.set_reach(spec.pair(b["problem"]), 0.0)  # variants serve every shape of the pair
        if b.get("served_by") == "torch":  # the baseline, where no variant beat it
            ops.stage(0, spec.pair(b["problem"]), [max(1, int(n)) for n in sizes], int(kind), "")
            continue
        # the calls the variant serves where the check gave torch's op one kind (tuner_op.h's Serves);
        # left out where it serves both, so that a binding built before the argument loads
        serves = (sum(SERVES.values()) - SERVES[b["torch_serves"]],) if b.get("torch_serves") else ()
        ops.stage(table(opened[b["library"]], b["entry"], spec.abi, b["variant"]), -1, [max(1, int(n)) for n in sizes],
                  int(kind), b.get("tuned_for", ""), *serves)
    return list(opened.values())


def load_export(directory: Path, spec: OpSpec, *, validate: str = "async", baseline: bool = True):
    """Bind an export's prebuilt binaries; BuildMismatch when they were built for another
    torch/CUDA/Python/platform or GPU architecture than this process has."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    binaries = manifest.get("binaries")
    if not binaries:
        raise BuildMismatch(f"{directory} holds sources only (no binaries); load it with tuner.load", ["binaries"])
    arch = attached_arch()
    diff = differences(binaries["identity"], arch)
    if diff:
        raise BuildMismatch(f"{directory} was built for another setup: {'; '.join(diff)}. Export it again on a "
                            "machine like this one, or load its sources with tuner.load where a CUDA toolkit and "
                            "a C++ compiler are installed", diff)
    libraries = {name: directory / name for name in binaries["libraries"]}
    return bind(spec, directory / binaries["binding"]["file"], binaries["bound"], libraries, validate=validate,
                baseline=baseline)


# ----------------------------------------------------------------- validate modes

def loaded_families() -> list[str]:
    """The families whose export this process has loaded."""
    return list(_loaded)


def loaded(family: str) -> Loaded:
    if family not in _loaded:
        raise RuntimeError(f"no {family} export is loaded; load one first")
    return _loaded[family]


def set_validate(mode: str) -> None:
    """How kernel-found bad input is reported, for every op loaded through this runtime:
    "async" (default) on a later call without a sync, "sync" in the call, "deferred" at
    check_errors()."""
    if mode not in VALIDATE:
        raise ValueError(f"validate must be one of {tuple(VALIDATE)}")
    if not _loaded:
        raise RuntimeError("no tuned op is loaded; load one first")
    for state in _loaded.values():
        state.ops.set_check(VALIDATE[mode])


def check_errors() -> None:
    """Raise KernelInputError if an earlier call saw bad input not yet reported (syncs)."""
    import torch

    if not torch.cuda.is_available():
        return
    for state in _loaded.values():
        bits = int(state.ops.take_errors())
        if bits:
            raise KernelInputError(f"{state.spec.op}: invalid input in an earlier call: "
                                   f"{state.ops.describe_errors(bits)}")
