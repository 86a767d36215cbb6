"""Compile variants: one ninja file per batch, cached by content hash, with a ptxas report.

Each variant is a CUDA-headers-only translation unit compiled by nvcc into a small
shared library (about 2 s of one core). A batch goes into a single ninja file so
ninja spreads it over the cores; `torch.utils.cpp_extension` builds the one
torch binding (see `tuner.binding`), which loads any variant through a C table.

Files, named by the content hash of everything that can change the binary
(rendered source, headers, flags, nvcc, torch, arch):
    variants/<arch>/<family>-<hash>.cu / .so / .log / .json
The .json is written last, so a build killed half-way is simply built again; a
variant with a .json is never rebuilt (a failed compile is remembered too).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from tuner import families, paths, toolkit
from tuner.errors import BuildError, ToolchainError
from tuner.render import header_text, render, templates_dir
from tuner.variant import Variant

BASE_FLAGS = (
    "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
    "-cudart", "shared", "-Xptxas", "-v",
)


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
    so: Path | None = None

    def regs(self, kind: str) -> int | None:
        """The most registers a kernel of this kind (forward, backward) uses, over its instances."""
        found = [n for k, n in self.registers.items() if k == kind or k.startswith(kind + "_")]
        return max(found) if found else None

    def summary(self) -> dict:
        return {
            "name": self.variant.name, "key": self.key, "arch": self.arch, "ok": self.ok,
            "cached": self.cached, "compile_s": round(self.compile_s, 3), "registers": self.registers,
            "spill_bytes": self.spill_bytes, "smem_bytes": self.smem_bytes, "stack_bytes": self.stack_bytes,
            "error": self.error,
        }


def gencode(arch: str) -> str:
    number = arch.split("_", 1)[1]
    return f"-gencode=arch=compute_{number},code={arch}"


def flags(arch: str) -> list[str]:
    return [*BASE_FLAGS, gencode(arch)]


def torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def content_key(variant: Variant, source: str, arch: str) -> str:
    h = hashlib.sha256()
    for part in (source, header_text(variant.family), " ".join(flags(arch)), toolkit.nvcc_version(),
                 torch_version(), arch):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


# ------------------------------------------------------------------ ptxas

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for")
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
    so = path.with_suffix(".so")
    if meta.get("ok") and not so.exists():
        return None
    return Build(variant, arch, key, bool(meta["ok"]), cached=True, compile_s=meta.get("compile_s", 0.0),
                 registers=meta.get("registers", {}), spill_bytes=meta.get("spill_bytes", 0),
                 smem_bytes=meta.get("smem_bytes", 0), stack_bytes=meta.get("stack_bytes", 0),
                 error=meta.get("error", ""), so=so if meta.get("ok") else None)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _ninja() -> str:
    exe = shutil.which("ninja")
    if exe is None:
        try:
            import ninja  # the PyPI package ships the binary

            exe = str(Path(ninja.BIN_DIR) / "ninja")
        except ImportError:
            pass
    if exe is None:
        raise ToolchainError("ninja is not installed: pip install ninja")
    return exe


def _ninja_times(log: Path) -> dict[str, float]:
    """Seconds per output from ninja's own log (start and end in ms)."""
    times = {}
    if log.exists():
        for line in log.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 4 and parts[0].isdigit():
                times[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000.0
    return times


def build(variants: Iterable[Variant], arch: str, jobs: int | None = None, root: Path | None = None,
          timeout: float = 900.0, sources: dict[str, str] | None = None) -> list[Build]:
    """Build variants for `arch`, in parallel, skipping any already built; one Build each, in order.

    Failures (template or compiler) are returned as Builds with ok=False and the
    message; only a missing toolchain raises. `sources` (variant name -> CUDA source)
    builds given sources instead of rendering, e.g. those of an exported artifact.
    """
    out_dir = arch_dir(arch, root)
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_batches(out_dir)
    slots: list[Build | str] = []  # a Build, or the key of a build still to come
    todo: dict[str, tuple[Variant, str]] = {}  # key -> (variant, source)
    for variant in variants:
        try:
            source = sources[variant.name] if sources and variant.name in sources else render(variant)
        except BuildError as exc:
            slots.append(Build(variant, arch, "", ok=False, error=exc.message))
            continue
        key = content_key(variant, source, arch)
        cached = None if key in todo else _load_meta(out_dir / f"{variant.family}-{key}.json", variant, arch, key)
        if cached is not None:
            slots.append(cached)
        else:
            todo[key] = (variant, source)
            slots.append(key)
    built = {b.key: b for b in _compile(todo, arch, out_dir, jobs, timeout)} if todo else {}
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
             timeout: float) -> list[Build]:
    nvcc = toolkit.nvcc()
    jobs = jobs or os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix=".batch-", dir=out_dir))
    try:
        lines = [
            "ninja_required_version = 1.3",
            f"nvcc = {nvcc}",
            f"flags = {' '.join(flags(arch))}",
            "rule nvcc",
            "  command = $nvcc $flags $include -o $out $in > $out.log 2>&1",
            "  description = nvcc $out",
        ]
        for key, (variant, source) in todo.items():
            stem = f"{variant.family}-{key}"
            (tmp / f"{stem}.cu").write_text(source)
            lines.append(f"build {stem}.so: nvcc {stem}.cu")
            lines.append(f"  include = -I{templates_dir(variant.family)}")
        (tmp / "build.ninja").write_text("\n".join(lines) + "\n")
        cmd = [_ninja(), "-C", str(tmp), "-k", "0", "-j", str(jobs)]
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            ninja_out = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            ninja_out = f"ninja timed out after {timeout:.0f} s\n{exc.stdout or ''}"
        wall = time.monotonic() - started
        times = _ninja_times(tmp / ".ninja_log")
        results = []
        for key, (variant, source) in todo.items():
            stem = f"{variant.family}-{key}"
            so, log = tmp / f"{stem}.so", tmp / f"{stem}.so.log"
            log_text = log.read_text(errors="replace") if log.exists() else ""
            ok = f"{stem}.so" in times and so.exists()
            ptx = parse_ptxas(log_text, getattr(families.get(variant.family), "KERNEL_ARGS", {}))
            meta = {"name": variant.name, "params": variant.as_dict(), "key": key, "arch": arch, "ok": ok,
                    "compile_s": times.get(f"{stem}.so", wall), **ptx,
                    "error": "" if ok else (_compiler_error(log_text) or ninja_out.strip()[-4000:])}
            (out_dir / f"{stem}.cu").write_text(source)
            if log.exists():
                os.replace(log, out_dir / f"{stem}.log")
            if ok:
                os.replace(so, out_dir / f"{stem}.so")
            if ok or log_text:  # a compile that never ran (timeout, kill) is not remembered
                _write_json(out_dir / f"{stem}.json", meta)
            results.append(Build(variant, arch, key, ok, cached=False, compile_s=meta["compile_s"],
                                 registers=ptx["registers"], spill_bytes=ptx["spill_bytes"],
                                 smem_bytes=ptx["smem_bytes"], stack_bytes=ptx["stack_bytes"],
                                 error=meta["error"], so=out_dir / f"{stem}.so" if ok else None))
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _compiler_error(log: str) -> str:
    """The compiler's error lines (without ptxas' info chatter)."""
    lines = [line for line in log.splitlines() if "ptxas info" not in line and not line.startswith("    ")]
    return "\n".join(lines).strip()[-4000:]

