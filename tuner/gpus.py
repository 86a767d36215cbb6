"""GPU names to CUDA architectures, and what is attached."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from tuner.errors import GpuError, GpuNameError

# Marketing name -> compute capability. Matching is on the normalised name
# (lower case, no spaces or dashes), so "RTX 4090", "rtx4090" and "A10G" all work.
ARCHS: dict[str, str] = {
    "T4": "sm_75",
    "A100": "sm_80",
    "A10": "sm_86",
    "A10G": "sm_86",
    "L4": "sm_89",
    "RTX4090": "sm_89",
    "H100": "sm_90",
    "H200": "sm_90",
    "H20": "sm_90",
    "B200": "sm_100",
}

_ARCH = re.compile(r"^sm_(\d{2,3})[a-z]?$")
# Compute capabilities nvcc has compiled for (CUDA 10 to 13): another number is a typo, not a GPU
KNOWN_ARCHS = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 88, 89, 90, 100, 101, 103, 110, 120, 121)


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).upper()


def arch_of(gpu: str) -> str:
    """Architecture for a GPU name (`L4` -> `sm_89`); `auto` asks the attached GPU."""
    if gpu.lower() == "auto":
        return attached().arch
    arch = ARCHS.get(_norm(gpu))
    if arch is None:
        known = ", ".join(sorted(ARCHS))
        raise GpuNameError(f"unknown GPU {gpu!r}: known names are {known}, or 'auto'; or pass --arch sm_XX")
    return arch


def check_arch(arch: str) -> str:
    m = _ARCH.match(arch)
    if not m:
        raise GpuNameError(f"bad architecture {arch!r}: expected the form sm_90")
    if int(m.group(1)) not in KNOWN_ARCHS:
        raise GpuNameError(f"unknown architecture {arch!r}: known sm_{', sm_'.join(map(str, KNOWN_ARCHS))}")
    return arch


def resolve(gpu: str | None, arch: str | None) -> str:
    """The target architecture from the CLI's --gpu / --arch pair (--arch wins)."""
    if arch:
        return check_arch(arch)
    if not gpu:
        raise GpuNameError("name a GPU with --gpu (e.g. --gpu L4, --gpu auto) or an architecture with --arch")
    if gpu.lower() == "auto":
        return attached(asked="--gpu auto", hint="; name the target instead (--gpu H100 or --arch sm_90): "
                                                 "compiling needs no GPU").arch
    return arch_of(gpu)


class Attached:
    """The GPU this process sees: name, arch, and what a study records about it."""

    def __init__(self, index: int = 0):
        import torch

        props = torch.cuda.get_device_properties(index)
        self.index = index
        self.name: str = props.name
        self.capability = (props.major, props.minor)
        self.arch = f"sm_{props.major}{props.minor}"
        self.sm_count: int = props.multi_processor_count
        self.l2_bytes: int = getattr(props, "L2_cache_size", 0)
        # a str, not torch's TorchVersion: a worker's hello carries this, and unpickling a
        # TorchVersion imports torch in the search's process (seconds, while its GPU waits)
        self.torch = str(torch.__version__)
        self.cuda = torch.version.cuda or ""

    def matches(self, gpu: str) -> bool:
        """Does a requested name such as `H100` or `auto` describe this GPU?"""
        return name_matches(self.name, gpu)

    def describe(self, driver: str | None = None) -> dict:
        """`driver`: the driver's version where the caller read it already (nvidia-smi takes a while)."""
        return {
            "gpu_name": self.name,
            "capability": f"{self.capability[0]}.{self.capability[1]}",
            "arch": self.arch,
            "sm_count": self.sm_count,
            "l2_bytes": self.l2_bytes,
            "torch": self.torch,
            "cuda": self.cuda,
            "driver": driver_version() if driver is None else driver,
        }


def name_matches(name: str, gpu: str) -> bool:
    """Does a requested name such as `H100` or `auto` describe the device named `name`?"""
    if gpu.lower() == "auto":
        return True
    # Compare whole words of the device name ("NVIDIA H100 80GB HBM3"), and
    # pairs of them for names like "RTX 4090", so that H20 never matches H200.
    words = [_norm(w) for w in re.split(r"[\s\-]+", name) if w]
    names = set(words) | {a + b for a, b in zip(words, words[1:])}
    return _norm(gpu) in names


def short_name(gpu: Attached) -> str:
    """The known name a device answers to ('NVIDIA H100 80GB HBM3' -> 'H100'), else its full name."""
    return short_name_of(gpu.name)


def short_name_of(name: str) -> str:
    for known in ARCHS:
        if name_matches(name, known):
            return known
    return name


def attached(index: int = 0, asked: str = "", hint: str = "") -> Attached:
    """The GPU of CUDA index `index`; where there is none, the error starts with what needed one
    (`asked`: "--gpu auto" on the command line, "tuner.load(gpu='auto')" in Python) and ends with
    `hint`, what to do instead."""
    import torch

    if not torch.cuda.is_available():
        raise GpuError(f"{asked + ': ' if asked else ''}no CUDA GPU is attached "
                       f"(torch.cuda.is_available() is False){hint}")
    if index >= torch.cuda.device_count():
        raise GpuError(f"no CUDA device {index}: this machine shows {torch.cuda.device_count()} "
                       f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    return Attached(index)


def mismatch(gpu: str, name: str) -> GpuError:
    return GpuError(f"--gpu {gpu} was asked for, but the attached GPU is {name}; "
                    f"use --gpu auto (or the attached GPU's name) to tune for it")


def attached_for(gpu: str, index: int = 0) -> Attached:
    """The attached GPU, which must be the one `gpu` names (a search runs on the GPU it tunes for)."""
    can_search(gpu)
    found = attached(index)
    if not found.matches(gpu):
        raise mismatch(gpu, found.name)
    return found


def can_search(gpu: str) -> None:
    """Fail, before anything is written, where a search for `gpu` cannot run: an unknown name, a
    GPU of another model, or no GPU attached to time the variants on. Where nvidia-smi shows the
    GPU this takes milliseconds; otherwise torch is asked (importing it takes seconds)."""
    if gpu.lower() != "auto":
        arch_of(gpu)  # an unknown name is an error that lists the known ones
    seen = visible()
    if seen is not None:
        if not name_matches(seen.name, gpu):
            raise mismatch(gpu, seen.name)
        return
    import torch

    if not torch.cuda.is_available():
        auto = gpu.lower() == "auto"
        raise GpuError(f"--gpu {gpu}: a search times variants on the GPU it tunes for, and no CUDA GPU is attached "
                       f"(torch.cuda.is_available() is False); run it on a machine "
                       f"{'with a CUDA GPU' if auto else f'whose GPU is {gpu}'}, or replay recorded measurements "
                       f"with --simulate FILE (`tuner build --gpu {'H100' if auto else gpu}` compiles variants "
                       "without a GPU)")


@dataclass(frozen=True)
class Seen:
    """A GPU as nvidia-smi shows it."""

    name: str
    arch: str
    driver: str = ""


@functools.lru_cache(maxsize=None)
def visible(index: int = 0) -> Seen | None:
    """CUDA device `index` as nvidia-smi shows it, without starting CUDA (milliseconds, where
    importing torch and starting CUDA take seconds); None when it cannot be told that way
    (no nvidia-smi, CUDA_VISIBLE_DEVICES empty or naming UUIDs or MIG slices). nvidia-smi
    numbers GPUs by PCI bus, CUDA fastest first: on a machine of mixed models the two can
    differ, so a search checks this against what its worker's CUDA reports."""
    import subprocess

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [x.strip() for x in listed.split(",")]
        if index >= len(ids) or not ids[index].isdigit():
            return None
        smi_index = ids[index]
    else:
        smi_index = str(index)
    cmd = ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader", f"--id={smi_index}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    fields = [f.strip() for f in out.stdout.strip().split(",")] if out.returncode == 0 else []
    if len(fields) != 3 or not re.fullmatch(r"\d+\.\d+", fields[1]):
        return None
    major, minor = fields[1].split(".")
    return Seen(fields[0], f"sm_{major}{minor}", fields[2])


def visible_count() -> int | None:
    """How many GPUs CUDA sees, without starting CUDA: CUDA_VISIBLE_DEVICES's indices, else
    nvidia-smi's list; None when it cannot be told that way (as `visible`)."""
    import subprocess

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = [x.strip() for x in listed.split(",") if x.strip()]
        return len(ids) if all(x.isdigit() for x in ids) else None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return len(lines) if out.returncode == 0 and lines and all(x.isdigit() for x in lines) else None


def visible_name() -> str | None:
    """The first visible GPU's name from nvidia-smi, without starting CUDA; None when it cannot
    be read that way."""
    seen = visible()
    return seen.name if seen else None


def device_indices(spec: str | None) -> list[int]:
    """`--devices`: "all", or CUDA indices such as "0,1" (as CUDA_VISIBLE_DEVICES numbers them);
    None: device 0."""
    if spec is None:
        return [0]
    if spec.strip().lower() == "all":
        count = visible_count()
        if count is None:  # not told by nvidia-smi: CUDA counts them (torch's import, seconds)
            import torch

            count = torch.cuda.device_count()
        if count == 0:
            raise GpuError("--devices all: no CUDA GPU is attached")
        return list(range(count))
    try:
        found = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise GpuError(f"--devices takes 'all' or CUDA indices such as 0,1; got {spec!r}") from None
    if not found or len(set(found)) != len(found) or min(found) < 0:
        raise GpuError(f"--devices takes 'all' or distinct CUDA indices such as 0,1; got {spec!r}")
    count = visible_count()
    if count is not None and max(found) >= count:
        raise GpuError(f"--devices {spec}: no CUDA device {max(found)}; this machine shows {count} "
                       f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
    return found


def driver_version() -> str:
    """The NVIDIA driver version, or '' when it cannot be read."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""
