"""Find the CUDA toolkit and describe the compilers that builds depend on.

`torch.utils.cpp_extension` guesses CUDA_HOME from the `nvcc` on PATH when the
variable is unset. Some machines put a small wrapper script there
(`exec /usr/local/cuda-13.0/bin/nvcc "$@"`), so the guess lands outside the
toolkit and linking fails on `-lcudart`. We resolve the real toolkit first and
export CUDA_HOME before cpp_extension is imported anywhere.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path

from tuner.errors import ToolchainError

_EXEC_LINE = re.compile(r"""exec\s+["']?(/[^\s"']+/nvcc)\b""")


def _toolkit_of(nvcc: Path) -> Path | None:
    """The toolkit root of an nvcc binary, following wrapper scripts."""
    nvcc = nvcc.resolve()
    root = nvcc.parent.parent
    if (root / "include" / "cuda_runtime.h").exists():
        return root
    try:
        head = nvcc.read_bytes()[:4096]
    except OSError:
        return None
    if head.startswith(b"#!"):
        match = _EXEC_LINE.search(head.decode(errors="replace"))
        if match:
            return _toolkit_of(Path(match.group(1)))
    return None


@functools.lru_cache(maxsize=None)
def cuda_home() -> Path:
    """The CUDA toolkit root: $CUDA_HOME / $CUDA_PATH, else the real home of `nvcc`."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and (Path(value) / "bin" / "nvcc").exists():
            return Path(value)
    candidates = []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for nvcc in candidates:
        if nvcc.exists():
            root = _toolkit_of(nvcc)
            if root is not None:
                return root
    raise ToolchainError(
        "no CUDA toolkit found: set CUDA_HOME to the toolkit root (the folder holding bin/nvcc "
        "and include/cuda_runtime.h)"
    )


def export_cuda_home() -> Path:
    """Point CUDA_HOME at the real toolkit so cpp_extension links against its libcudart."""
    root = cuda_home()
    os.environ["CUDA_HOME"] = str(root)
    return root


def nvcc() -> Path:
    return cuda_home() / "bin" / "nvcc"


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    """The release line of `nvcc --version`, e.g. 'Cuda compilation tools, release 13.0, V13.0.88'."""
    try:
        out = subprocess.run(
            [str(nvcc()), "--version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"cannot run {nvcc()}: {exc}") from exc
    lines = [line for line in out.splitlines() if "release" in line]
    return lines[-1].strip() if lines else out.strip().splitlines()[-1]


@functools.lru_cache(maxsize=None)
def compute_capabilities() -> tuple[int, ...] | None:
    """The architectures the installed nvcc compiles for (`nvcc --list-gpu-arch`: 75 ... 121 for
    CUDA 13), or None where there is no nvcc to ask."""
    try:
        out = subprocess.run([str(nvcc()), "--list-gpu-arch"], capture_output=True, text=True, timeout=60)
    except (ToolchainError, OSError, subprocess.SubprocessError):
        return None
    found = tuple(int(m) for m in re.findall(r"compute_(\d+)", out.stdout))
    return found or None


@functools.lru_cache(maxsize=None)
def torch_version() -> str:
    """The installed torch's version (a build's identity: what a binary was built against); read
    once (importlib's metadata parse costs ~6 ms, and every variant's content key asks)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"
