"""How long one RMSNorm variant takes to compile, three ways, on this machine's cores (no GPU
needed): nvcc as the search builds a variant (host and device code, a shared object), nvcc for the
device code alone (-cubin), and NVRTC in this process (the pip wheel's libnvrtc, as PyTorch's
JITerator compiles) on the kernels alone; and each way's registers per kernel (ptxas -v), to see
whether NVRTC's code is the same.

    python tools/nvrtc_probe.py [--variants 4] [--arch sm_90] [--batch 24]

NVRTC compiles device code only: a variant's host part (its launches and C table) would need the
driver API (cuLaunchKernel) instead, which this probe does not write. Here the rendered source is
cut before its host part (RMSNorm's first host function) and each kernel is instantiated by name.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuner.build import compile as build
from tuner.build import render
from tuner.build import toolkit
from tuner.families import rms_norm

HOST_START = re.compile(r"^bool vectors\(", re.M)  # RMSNorm's first host function
KERNELS = ("forward_kernel", "backward_kernel", "forward_resident", "backward_resident")


def nvrtc_library():
    import nvidia  # the CUDA wheels torch depends on

    for root in nvidia.__path__:
        found = sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
        if found:  # its builtins first, from the same folder (they are not on the loader's path)
            for builtins in sorted(glob.glob(os.path.join(os.path.dirname(found[0]), "libnvrtc-builtins.so*"))):
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL(found[0])
    raise SystemExit("no libnvrtc in the nvidia wheels")


def nvrtc_compile(lib, source: str, arch: str, include: str) -> tuple[float, str]:
    """(seconds, compile log with ptxas's register counts) for a cubin of the kernels of `source`, instantiated for vector widths 1 and VEC."""
    vec = int(re.search(r"constexpr int VEC = (\d+);", source).group(1))
    prog = ctypes.c_void_p()
    t0 = time.perf_counter()
    check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"variant.cu", 0, None, None))
    for name in KERNELS:
        for v in sorted({1, vec}):
            check(lib, lib.nvrtcAddNameExpression(prog, f"{name}<{v}>".encode()))
    check(lib, lib.nvrtcAddNameExpression(prog, b"finish_weight"))
    opts = [f"-arch={arch}", "-std=c++17", f"-I{include}", "-default-device", "--ptxas-options=-v"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts]))
    if rc != 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise SystemExit(f"NVRTC failed:\n{log.value.decode()[:3000]}")
    size = ctypes.c_size_t()
    check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
    cubin = ctypes.create_string_buffer(size.value)
    check(lib, lib.nvrtcGetCUBIN(prog, cubin))
    seconds = time.perf_counter() - t0
    check(lib, lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)))
    log = ctypes.create_string_buffer(size.value)
    check(lib, lib.nvrtcGetProgramLog(prog, log))
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return seconds, log.value.decode(errors="replace")


def kernels_of(source: str) -> str:
    """A rendered RMSNorm variant's device part: cut before its host part, without the host
    headers, its anonymous namespace closed."""
    kernels = source[:HOST_START.search(source).start()]
    kernels = re.sub(r'#include (<initializer_list>|<cuda_runtime.h>|"rms_norm_abi.h")\n', "", kernels)
    return kernels + "}  // namespace\n"


def check(lib, rc: int) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise SystemExit(f"NVRTC: {lib.nvrtcGetErrorString(rc).decode()}")


def registers(log: str) -> dict[str, int]:
    """Kernel (name<vector width>) -> registers, from ptxas's -v lines in a compile log."""
    found, name = {}, None
    for line in log.splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?(\w+)'?", line)
        if m:
            name = m.group(1)
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            stem = next((k for k in (*KERNELS, "finish_weight") if k in name), name)
            vec = re.search(r"ILi(\d+)E", name)
            found[f"{stem}<{vec.group(1)}>" if vec else stem] = int(m.group(1))
    return found


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, done.stdout + done.stderr


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", type=int, default=4)
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--batch", type=int, default=0, metavar="N",
                   help="then N variants as a search builds them, against NVRTC with a thread per core")
    args = p.parse_args()
    lib = nvrtc_library()
    nvcc = toolkit.nvcc()
    include = str(Path(toolkit.cuda_home()) / "include")
    times: dict[str, list[float]] = {"nvcc shared object": [], "nvcc -cubin": [], "NVRTC": []}
    print(f"{os.cpu_count()} cores; nvcc {toolkit.nvcc_version()}; one compile at a time")
    with tempfile.TemporaryDirectory() as tmp:
        headers = str(render.write_headers("rms_norm", Path(tmp, "include")))  # its ABI, rendered as a build does
        for i, variant in enumerate(rms_norm.covering_set()[:args.variants]):
            source = render.render(variant)
            cu = Path(tmp, f"v{i}.cu")
            cu.write_text(source)
            flags = [*build.flags(args.arch), f"-I{headers}"]
            times["nvcc shared object"].append(timed([nvcc, *flags, "-o", str(cu.with_suffix(".so")), str(cu)])[0])
            device = [f for f in flags if f not in ("-shared", "-Xcompiler", "-fPIC", "-fvisibility=hidden")]
            seconds, nvcc_log = timed([nvcc, *device, "-cubin", "-o", str(cu.with_suffix(".cubin")), str(cu)])
            times["nvcc -cubin"].append(seconds)
            seconds, nvrtc_log = nvrtc_compile(lib, kernels_of(source), args.arch, include)
            times["NVRTC"].append(seconds)
            a, b = registers(nvcc_log), registers(nvrtc_log)
            same = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))}
            print(f"{variant.name}: " + ", ".join(f"{k} regs nvcc {x} / NVRTC {y}" for k, (x, y) in same.items()),
                  flush=True)
    for how, values in times.items():
        print(f"{how:>20}: median {statistics.median(values):.2f} s per variant (min {min(values):.2f}, "
              f"max {max(values):.2f}, {len(values)} variants)")
    if args.batch:
        batch(lib, include, args.arch, args.batch)


def batch(lib, include: str, arch: str, count: int) -> None:
    """`count` variants as a search builds them (tuner.build: nvcc units of several variants, one
    per core, in a fresh folder) against the same variants' kernels by NVRTC in a thread per core."""
    from concurrent.futures import ThreadPoolExecutor

    from tuner.families.rms_norm import all_spaces

    spread = [v for space in all_spaces() for v in space]
    variants = [spread[i * len(spread) // count] for i in range(count)]
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        built = build.build(variants, arch, jobs=cores, root=Path(tmp))
        nvcc_s = time.perf_counter() - t0
    assert all(b.ok for b in built), [b.error for b in built if not b.ok][:1]

    def one(variant):
        return nvrtc_compile(lib, kernels_of(render.render(variant)), arch, include)[0]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(one, variants))
    nvrtc_s = time.perf_counter() - t0
    print(f"{count} variants on {cores} cores: tuner.build (nvcc units) {nvcc_s:.1f} s, {nvcc_s / count:.2f} s a "
          f"variant; NVRTC, a thread per core, kernels only {nvrtc_s:.1f} s, {nvrtc_s / count:.2f} s a variant")


if __name__ == "__main__":
    sys.exit(main())
