"""`tuner.load`: an exported folder's op, from its prebuilt binaries where they fit this machine.

An export made by `export-best` holds the family's torch binding and its winners' variants
built for the study's GPU (tuner/deploy/binaries.py). Where the build identity matches the running
torch, CUDA, Python, platform and GPU, `tuner.runtime` loads those as they are: no nvcc, no
C++ compiler, no ninja. Where it does not, the sources are built (one warning says why) if a
toolchain is here, else a clear error names what differs and the ways out.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from tuner import families, gpus, paths, runtime
from tuner.deploy import binaries
from tuner.build import binding
from tuner.deploy import export as artifacts
from tuner.errors import TunerError
from tuner.build.render import header_text

FALLBACKS = ("rebuild", "reference")


def load(directory: str | Path | None = None, *, gpu: str | None = None, family: str | None = None,
         validate: str = "async", fallback: str = "rebuild", prebuilt: bool = True, baseline: bool = True):
    """Load a tuned artifact and return its family's op (`torch.ops.tuner.<op>`, called through its
    binding's own entry: tuner.entries.loaded).

    `load("DIR")` loads an exported folder, whatever family it holds; `load(gpu="auto")` (or
    `gpu="H100"`) finds the default export of that GPU under $TUNER_HOME/exports, of `family`
    when several families were exported for it. `validate`: how bad input a kernel finds is
    reported ("async", "sync", "deferred"; see tuner.runtime). `fallback`: on a GPU of another
    architecture than the export's, "rebuild" its variants for this one (a warning) or serve
    calls with the "reference". `prebuilt=False` builds from the sources even where the
    export's binaries would fit. Where the family's op has a baseline (the torch op it replaces), it
    serves the problems where no variant beat it, untuned dtype pairs and shapes far from every
    tuned one; `baseline=False` runs the nearest variant wherever a dtype pair has one.
    """
    if family is not None and family not in families.names():
        raise TunerError(f"family={family!r}: no such family; installed: {', '.join(families.names())}")
    if directory is None:
        if not isinstance(gpu, str) or not gpu:
            raise TunerError("tuner.load needs an artifact folder or gpu=... (a GPU's name, e.g. 'H100', or 'auto'), "
                             f"got gpu={gpu!r}")
        directory = find_export(gpu, family)
    directory = Path(directory)
    manifest = artifacts.read(directory)
    name = manifest["family"]
    if family is not None and name != family:
        raise TunerError(f"{directory} holds the {name} family, not {family}")
    if manifest["header_sha256"] != artifacts.sha256(header_text(name)):
        raise TunerError(f"{directory} was exported by a tuner with another kernel ABI; export it again")
    fam, spec = families.get(name), families.part(name, "op").OP
    if validate not in runtime.VALIDATE:
        raise TunerError(f"validate must be one of {tuple(runtime.VALIDATE)}: 'async' raises on a later call "
                         "without syncing, 'sync' raises at once (a sync per call), 'deferred' at check_errors()")
    if fallback not in FALLBACKS:
        raise TunerError(f"fallback must be one of {FALLBACKS}")

    built = manifest.get("binaries") if prebuilt else None
    identity = built["identity"] if built else {}
    differs = runtime.differences(identity, None) if built else []
    why = (f"its binaries were built for another setup ({'; '.join(differs)})" if differs else
           "it holds no binaries" if prebuilt and not built else "")
    if built and not differs:
        binding_path = directory / built["binding"]["file"]
    else:
        _can_build(directory, why)
        binding_path = binding.library(name)

    winners = built["bound"] if built else binaries.bound(fam, spec, manifest["entries"], manifest.get("regions", []))
    libraries: dict[str, Path] = {}
    reference = False
    arch = runtime.attached_arch()
    if arch is not None:
        if manifest.get("arch") != arch:
            tuned = f"{directory} was tuned for {manifest.get('arch')} ({manifest['gpu'].get('gpu_name')})"
            here = f"this GPU is {gpus.attached().name} ({arch})"
            reference = fallback == "reference"
            warnings.warn(f"{tuned} but {here}: " + ("using the reference" if reference else
                          f"building its variants for {arch}; timings may differ, tune on this GPU for the best"),
                          stacklevel=2)
        if not reference and built and not differs and identity.get("arch") == arch:
            libraries = {lib: directory / lib for lib in built["libraries"]}
        elif not reference:  # the binding's branch above said why (or the warning on another arch)
            sources = {e["variant"]: (directory / e["source"]).read_text() for e in manifest["entries"]}
            winners, libraries = binaries.build_variants(fam, winners, arch, sources=sources, baseline=spec.baseline)
    return runtime.bind(spec, binding_path, winners, libraries, validate=validate, reference=reference,
                        baseline=baseline)


def _can_build(directory: Path, why: str) -> None:
    """Say why the sources are built (one warning), or fail clearly where nothing can build them."""
    missing = binaries.toolchain_missing()
    if missing:
        raise TunerError(f"{directory}: {why or 'it must be built here'}, and its sources cannot be built here: "
                         f"{missing}. Export it again on a machine like this one (`tuner export-best` with the same "
                         "torch, CUDA and GPU), or install a CUDA toolkit and a C++ compiler")
    if why:
        warnings.warn(f"{directory}: {why}; building it from its sources", stacklevel=3)


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
