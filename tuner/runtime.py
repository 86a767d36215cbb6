"""Load an exported artifact: the family it holds binds its winners to its op, which is returned.

Each family's `op` module does the binding. A family's op lives in C++ (its torch binding): a
call is one dispatcher hop into CUDA and Autograd kernels that pick a winner bound at load, and
only what is off the CUDA path (the CPU reference, the fake implementation for torch.compile) is
registered from Python.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tuner import export as artifacts
from tuner import families, gpus, paths
from tuner.errors import TunerError
from tuner.render import header_text

_loaded: dict[str, ModuleType] = {}  # family name -> its op module, once an artifact of it is loaded


def load(directory: str | Path | None = None, *, gpu: str | None = None, family: str | None = None,
         **options):
    """Load a tuned artifact and return its family's op (`torch.ops.tuner.<op>`).

    `load("DIR")` loads an exported folder, whatever family it holds; `load(gpu="auto")` (or
    `gpu="H100"`) finds the default export of that GPU under $TUNER_HOME/exports, of `family`
    when several families were exported for it. Other keywords go to the family's `load_op`
    (tuner/families/<name>/op.py: how bad input is reported, what to do on another GPU).
    """
    if directory is None:
        if gpu is None:
            raise TunerError("tuner.load needs an artifact folder or gpu=... (e.g. gpu='auto')")
        directory = find_export(gpu, family)
    directory = Path(directory)
    manifest = artifacts.read(directory)
    if family is not None and manifest["family"] != family:
        raise TunerError(f"{directory} holds the {manifest['family']} family, not {family}")
    ops = families.part(manifest["family"], "op")
    if manifest["header_sha256"] != artifacts.sha256(header_text(manifest["family"])):
        raise TunerError(f"{directory} was exported by a tuner with another kernel ABI; export it again")
    loaded = ops.load_op(directory, manifest, **options)
    _loaded[manifest["family"]] = ops
    return loaded


def find_export(gpu: str, family: str | None) -> Path:
    """The default export of a GPU (its short name or "auto"): of `family`, or of the one family
    exported for it."""
    label = gpus.short_name(gpus.attached()) if gpu.lower() == "auto" else gpu
    if family is not None:
        return artifacts.default_dir(label, family)
    found = [artifacts.default_dir(label, name) for name in families.names()
             if (artifacts.default_dir(label, name) / artifacts.MANIFEST).exists()]
    if len(found) == 1:
        return found[0]
    if not found:
        raise TunerError(f"no export for {label} under {paths.home() / 'exports'}; make one with "
                         f"`tuner export-best --gpu {label}`")
    raise TunerError(f"several families were exported for {label} ({', '.join(p.name for p in found)}); "
                     "pass family=...")


def set_validate(mode: str) -> None:
    """Switch how kernel-found bad input is reported, for every loaded family's op."""
    if not _loaded:
        raise TunerError("no artifact is loaded; call tuner.load(...) first")
    for ops in _loaded.values():
        ops.set_validate(mode)


def check_errors() -> None:
    """Raise KernelInputError if an earlier call of a loaded op saw bad input not yet reported (syncs)."""
    for ops in _loaded.values():
        ops.check_errors()
