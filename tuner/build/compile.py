"""Compile variants: several per translation unit (tuner.build.units), cached per variant by
content hash. A unit that fails to compile is built again one variant per unit, so one bad
variant costs its neighbours a retry, never their result. Units go into one compile queue
per process (tuner.build.queue), as many nvcc at once as cores, first come first served: the builds a
search runs side by side (its next batch while the last one's units end) share the cores without
oversubscribing them. `torch.utils.cpp_extension` (ninja) builds the one torch binding
(tuner.build.binding), which calls any variant through its table.

Files, named by the content hash of everything that can change a variant's binary
(rendered source, headers, flags, nvcc, torch, arch):
    variants/<arch>/<family>-<hash>.cu / .log / .json   one variant
    variants/<arch>/<family>-<hash>.so or <family>-unit-<hash>.so   the library holding it
The .json is written last, so a build killed half-way is simply built again; a
variant with a .json is never rebuilt (a failed compile is remembered too).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from tuner import families, paths
from tuner.build import libraries, toolkit
from tuner.build.toolkit import torch_version
from tuner.errors import BuildError
from tuner.build.render import header_text, render, templates_dir, write_headers
from tuner.build.queue import Running, queue_for, run_nvcc
from tuner.build.units import namespace, plan_units, unit_name, unit_source
from tuner.variant import Variant

BASE_FLAGS = (
    "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
    "-cudart", "shared", "-Xptxas", "-v",
)
# nvcc's -O is the host code's level (a variant's launchers); the device code is the same at any
# (cuobjdump's SASS and ptxas's registers of variants of every family compared at -O0 and -O3:
# identical). A variant built to be searched is timed on the GPU alone, so its host code is not
# optimized (a fifth of a unit's compile); an export's serves calls, whose host path a step pays.
HOST_OPT = {False: "-O0", True: "-O3"}  # serving -> the level


@dataclass
class Build:
    """The outcome of building one variant (cached or not)."""

    variant: Variant
    arch: str
    key: str
    ok: bool
    cached: bool = False
    compile_s: float = 0.0
    registers: dict[str, int] = field(default_factory=dict)  # kernel kind -> registers
    spill_bytes: int = 0
    smem_bytes: int = 0
    stack_bytes: int = 0
    error: str = ""
    folder: Path | None = None  # the arch's cache folder
    so: Path | None = None  # the library holding the variant (shared with a unit's other variants)
    entry: str | None = None  # the C name of its table there, when not the family's ENTRY
    unit_size: int = 1  # variants compiled in its translation unit

    def regs(self, kind: str) -> int | None:
        """The most registers a kernel of this kind (forward, backward) uses, over its instances."""
        found = [n for k, n in self.registers.items() if k == kind or k.startswith(kind + "_")]
        return max(found) if found else None

    def summary(self) -> dict:
        return {
            "name": self.variant.name, "key": self.key, "arch": self.arch, "ok": self.ok,
            "cached": self.cached, "compile_s": round(self.compile_s, 3), "registers": self.registers,
            "spill_bytes": self.spill_bytes, "smem_bytes": self.smem_bytes, "stack_bytes": self.stack_bytes,
            "error": self.error, "so": str(self.so) if self.so else None, "entry": self.entry,
            "unit_size": self.unit_size,
        }

    def file(self, suffix: str) -> Path:
        """The variant's own files in the cache: .cu, .log, .json."""
        return (self.folder or arch_dir(self.arch)) / f"{self.variant.family}-{self.key}{suffix}"


def gencode(arch: str) -> str:
    number = arch.split("_", 1)[1]
    return f"-gencode=arch=compute_{number},code={arch}"


def flags(arch: str, serving: bool = False) -> list[str]:
    return [HOST_OPT[serving], *BASE_FLAGS, gencode(arch)]


def content_key(variant: Variant, source: str, arch: str, serving: bool = False) -> str:
    h = hashlib.sha256()
    for part in (source, header_text(variant.family), " ".join(flags(arch, serving)), toolkit.nvcc_version(),
                 torch_version(), arch, *([libraries.key(used)] if (used := libraries.linked(variant.family)) else [])):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


# ------------------------------------------------------------------ ptxas

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_REGS = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _kind(mangled: str, labels: dict[str, str]) -> str:
    """forward/backward/validate + the kernel's integer template argument (named by the family's
    `KERNEL_ARGS`, e.g. a reduction or a mode) from a mangled kernel name."""
    for kind in ("forward", "backward", "validate"):
        if f"{kind}_kernel" in mangled:
            arg = re.search(r"ILi(\d+)E", mangled)
            return kind + (f"_{labels.get(arg.group(1), arg.group(1))}" if arg else "")
    return mangled


def parse_ptxas(log: str, labels: dict[str, str] | None = None) -> dict:
    """Registers per kernel, worst spill (stores + loads), shared memory and stack frame."""
    regs: dict[str, int] = {}
    spill = smem = stack = 0
    current = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = _kind(m.group(1), labels or {})
        elif (m := _FRAME.search(line)) and current:
            stack = max(stack, int(m.group(1)))
            spill = max(spill, int(m.group(2)) + int(m.group(3)))
        elif (m := _REGS.search(line)) and current:
            regs[current] = int(m.group(1))
            if s := _SMEM.search(line):
                smem = max(smem, int(s.group(1)))
    return {"registers": regs, "spill_bytes": spill, "smem_bytes": smem, "stack_bytes": stack}


# ------------------------------------------------------------------ build

def arch_dir(arch: str, root: Path | None = None) -> Path:
    return (root or paths.variants_dir()) / arch


def _load_meta(path: Path, variant: Variant, arch: str, key: str) -> Build | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    so = path.parent / meta["so"] if meta.get("so") else path.with_suffix(".so")
    if meta.get("ok") and not so.exists():
        return None
    return Build(variant, arch, key, bool(meta["ok"]), cached=True, compile_s=meta.get("compile_s", 0.0),
                 registers=meta.get("registers", {}), spill_bytes=meta.get("spill_bytes", 0),
                 smem_bytes=meta.get("smem_bytes", 0), stack_bytes=meta.get("stack_bytes", 0),
                 error=meta.get("error", ""), folder=path.parent, so=so if meta.get("ok") else None,
                 entry=meta.get("entry"), unit_size=meta.get("unit_size", 1))


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def build(variants: Iterable[Variant], arch: str, jobs: int | None = None, root: Path | None = None,
          timeout: float = 900.0, sources: dict[str, str] | None = None, focus: dict | None = None,
          on_ready: Callable[[list[Build]], None] | None = None, serving: bool = False) -> list[Build]:
    """Build variants for `arch`, in parallel, skipping any already built; one Build each, in order.
    `serving`: for an export, whose host code (the launchers) is on the op's call path: optimized.

    Failures (template or compiler) are returned as Builds with ok=False and the
    message; only a missing toolchain raises. `sources` (variant name -> CUDA source)
    builds given sources instead of rendering, e.g. those of an exported artifact;
    `focus` renders only the kernel instances one problem runs (see `render`).
    `on_ready(builds)` is called (from this thread) with the cached builds first, then with each
    translation unit's variants as soon as the unit is built, before the others end: a search
    evaluates them meanwhile. Units
    then differ in size (`plan_units(staggered=True)`), so that they end one after another.
    """
    out_dir = arch_dir(arch, root)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_batches(out_dir)
    slots: list[Build | str] = []  # a Build, or the key of a build still to come
    todo: dict[str, tuple[Variant, str]] = {}  # key -> (variant, source)
    for variant in variants:
        try:
            source = sources[variant.name] if sources and variant.name in sources else render(variant, focus)
        except BuildError as exc:
            slots.append(Build(variant, arch, "", ok=False, error=exc.message))
            continue
        key = content_key(variant, source, arch, serving)
        cached = None if key in todo else _load_meta(out_dir / f"{variant.family}-{key}.json", variant, arch, key)
        if cached is not None:
            slots.append(cached)
        else:
            todo[key] = (variant, source)
            slots.append(key)
    known = [s for s in slots if isinstance(s, Build)]
    if on_ready is not None and known and todo:  # the GPU takes the cached ones while the rest compile
        on_ready(known)
    built = {b.key: b for b in _compile(todo, arch, out_dir, jobs, timeout, flags(arch, serving), on_ready)} \
        if todo else {}
    return [built[s] if isinstance(s, str) else s for s in slots]


STALE_BATCH_S = 6 * 3600


def _remove_stale_batches(out_dir: Path) -> None:
    """Batch folders of builds that were killed (a live build's folder is minutes old)."""
    now = time.time()
    for tmp in out_dir.glob(".batch-*"):
        try:
            if now - tmp.stat().st_mtime > STALE_BATCH_S:
                shutil.rmtree(tmp, ignore_errors=True)
        except FileNotFoundError:
            pass


def _compile(todo: dict[str, tuple[Variant, str]], arch: str, out_dir: Path, jobs: int | None,
             timeout: float, nvcc_flags: list[str], on_ready=None) -> list[Build]:
    jobs = jobs or os.cpu_count() or 1
    units = plan_units(todo, jobs, staggered=on_ready is not None)
    built = _compile_units(units, todo, arch, out_dir, jobs, timeout, nvcc_flags, on_ready)
    # A unit that failed as a whole: its variants again, one per unit, for their own verdicts.
    retry = [[k] for unit in units if len(unit) > 1 and not built[unit[0]].ok for k in unit]
    if retry:
        built.update(_compile_units(retry, todo, arch, out_dir, jobs, timeout, nvcc_flags))
    return [built[k] for k in todo]


def _compile_units(units: list[list[str]], todo: dict[str, tuple[Variant, str]], arch: str, out_dir: Path,
                   jobs: int, timeout: float, nvcc_flags: list[str], on_ready=None) -> dict[str, Build]:
    """Each unit compiled by its own nvcc in the process's compile queue (tuner.build.queue); a
    Build per key. Only single-variant units remember failures. With `on_ready`, each unit's
    Builds are passed on (from this thread) as it ends, while the others compile; a unit that
    fails is left for the end (`_compile` builds its variants again alone)."""
    nvcc = toolkit.nvcc()
    tmp = Path(tempfile.mkdtemp(prefix=".batch-", dir=out_dir))
    results: dict[str, Build] = {}
    running = Running()
    try:
        headers: dict[str, Path] = {}
        futures = {}
        deadline = time.monotonic() + timeout
        pool = queue_for(jobs)
        for unit in units:
            family = todo[unit[0]][0].family
            name = unit_name(family, unit)
            if len(unit) == 1:
                text = todo[unit[0]][1]
            else:
                text = unit_source([(k, todo[k][1]) for k in unit], families.get(family).ENTRY)
            (tmp / f"{name}.cu").write_text(text)
            if family not in headers:  # a declared op's ABI is rendered
                headers[family] = write_headers(family, tmp / f"include-{family}")
            library_in, library_out = libraries.flags(libraries.linked(family))
            cmd = [nvcc, *nvcc_flags, f"-I{headers[family]}", f"-I{templates_dir(family)}", *library_in,
                   "-o", str(tmp / f"{name}.so"), str(tmp / f"{name}.cu"), *library_out]
            futures[pool.submit(run_nvcc, cmd, tmp / f"{name}.so.log", deadline, running)] = (name, unit)
        for future in concurrent.futures.as_completed(futures):
            name, unit = futures[future]
            builds = _unit_builds(unit, name, todo, arch, tmp, out_dir, *future.result())
            results.update((b.key, b) for b in builds)
            if on_ready is None:
                continue
            if all(b.ok for b in builds) or len(unit) == 1:
                on_ready(builds)
        return results
    except BaseException:
        running.stop()  # an interrupt or an error here: this build's compilers end with it
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unit_builds(unit: list[str], name: str, todo: dict[str, tuple[Variant, str]], arch: str, tmp: Path,
                 out_dir: Path, seconds: float, failure: str) -> list[Build]:
    """The Builds of one unit's variants from what its compile left in `tmp` (`seconds` it took;
    `failure`: why it failed, "" where nvcc ended well); its library moves to the cache."""
    family = todo[unit[0]][0].family
    so, log = tmp / f"{name}.so", tmp / f"{name}.so.log"
    log_text = log.read_text(errors="replace") if log.exists() else ""
    ok = not failure and so.exists()
    if ok:
        os.replace(so, out_dir / so.name)
    labels = getattr(families.get(family), "KERNEL_ARGS", {})
    builds = []
    for key in unit:
        variant, source = todo[key]
        stem = f"{family}-{key}"
        own_log = log_text if len(unit) == 1 else member_log(log_text, namespace(key))
        ptx = parse_ptxas(own_log, labels)
        entry = f"{families.get(family).ENTRY}_{key}" if len(unit) > 1 else None
        meta = {"name": variant.name, "params": variant.as_dict(), "key": key, "arch": arch, "ok": ok,
                "compile_s": seconds / len(unit), **ptx,
                "so": so.name if ok else None, "entry": entry, "unit_size": len(unit),
                "error": "" if ok else (_compiler_error(log_text) or failure.strip()[-4000:])}
        (out_dir / f"{stem}.cu").write_text(source)
        (out_dir / f"{stem}.log").write_text(own_log)
        # A compile that never ran (timeout, kill) is not remembered, nor a failed unit's
        # verdict on its variants (each is tried alone next).
        if ok or (log_text and len(unit) == 1):
            _write_json(out_dir / f"{stem}.json", meta)
        builds.append(Build(variant, arch, key, ok, cached=False, compile_s=meta["compile_s"],
                            registers=ptx["registers"], spill_bytes=ptx["spill_bytes"],
                            smem_bytes=ptx["smem_bytes"], stack_bytes=ptx["stack_bytes"],
                            error=meta["error"], folder=out_dir, so=out_dir / so.name if ok else None,
                            entry=entry, unit_size=len(unit)))
    return builds


def member_log(log: str, ns: str) -> str:
    """The lines of a unit's ptxas report about one variant's kernels (those named in `ns`)."""
    keep, mine = [], True
    for line in log.splitlines():
        if (m := _ENTRY.search(line)) or (m := _PROPERTIES.search(line)):
            mine = ns in m.group(1)
        if mine:
            keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


def _compiler_error(log: str) -> str:
    """The compiler's error lines (without ptxas' info chatter)."""
    lines = [line for line in log.splitlines() if "ptxas info" not in line and not line.startswith("    ")]
    return "\n".join(lines).strip()[-4000:]

