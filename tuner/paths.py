"""Where things live. $TUNER_HOME (default: the current folder) holds studies, exports and
reports; builds (variants and the torch bindings) go to a per-user cache shared by every
home: $TUNER_CACHE, else $XDG_CACHE_HOME/tuner, else ~/.cache/tuner."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


def home() -> Path:
    found = Path(os.environ.get("TUNER_HOME") or Path.cwd())
    if found.exists() and not found.is_dir():
        from tuner.errors import TunerError

        raise TunerError(f"TUNER_HOME={found} is a file, not a folder")
    return found


def cache_dir() -> Path:
    if os.environ.get("TUNER_CACHE"):
        return Path(os.environ["TUNER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tuner"


def variants_dir() -> Path:
    """Compiled variants and bindings: variants/<arch>/ and variants/_binding/ in the cache."""
    return cache_dir() / "variants"


def studies_dir() -> Path:
    return home() / "studies"


def worker_log() -> Path:
    """Where a search's worker writes (kernels' printf, device-side assert reports)."""
    return studies_dir() / "worker.log"


def reports_dir() -> Path:
    """`tuner report`'s default: reports/<study> under $TUNER_HOME, beside exports/."""
    return home() / "reports"


def bench_dir() -> Path:
    """`tuner bench`'s default output folder, under $TUNER_HOME too."""
    return home() / "bench-results"


def bytecode_dir() -> Path:
    return cache_dir() / "bytecode"


def keep_bytecode() -> bool:
    """Keep this process's bytecode in the cache where torch has none beside its sources.

    Images often install packages without bytecode and set PYTHONDONTWRITEBYTECODE; Python
    then compiles every module it imports, every time: torch's import took 4.3-5.7 s on an H100
    host against 2.1-2.2 s from bytecode kept in a folder of its own, and a search's GPU waits
    for it. Nothing is written beside the sources (`sys.pycache_prefix`, PEP 3147's tree under
    the cache). Off with TUNER_BYTECODE=0, or where a prefix is set already. Returns whether on.
    """
    import importlib.util

    if sys.pycache_prefix or os.environ.get("TUNER_BYTECODE", "1") == "0":
        return False
    try:
        spec = importlib.util.find_spec("torch")
        origin = spec.origin if spec is not None else None
        if origin is None or Path(importlib.util.cache_from_source(origin)).exists():
            return False  # torch has its bytecode (a usual pip install): nothing to gain
    except (ImportError, ValueError, NotImplementedError):
        return False
    try:  # a cache it cannot write would only make every import compile again
        bytecode_dir().mkdir(parents=True, exist_ok=True)
        if not os.access(bytecode_dir(), os.W_OK):
            return False
    except OSError:
        return False
    sys.pycache_prefix = str(bytecode_dir())
    sys.dont_write_bytecode = False
    return True


def nearest_existing(path: Path) -> Path:
    """`path` where it exists, else its nearest existing parent: where making it would start."""
    there = Path(path).absolute()
    while not there.exists() and there != there.parent:
        there = there.parent
    return there


@contextlib.contextmanager
def staged(out: Path, last: str | None = None):
    """A folder beside `out` to write into; when the block ends, its files are moved into `out`
    (made then), `last` after the others: a command that fails or is interrupted half-way leaves
    nothing in `out`, and what was there before stays whole. The folder's name holds this process's
    tag (tuner.owners: host, pid, start time), so that one left by a killed process (SIGKILL: no
    `finally`) is removed by the next staging beside it on the same host."""
    import glob
    import re
    import shutil
    import tempfile

    from tuner import owners

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    host, pid, start = owners.owner().rsplit("/", 2)
    mine = f".{out.name}.{re.sub(r'[^A-Za-z0-9-]', '_', host)}."  # a name of this host's processes
    for left in out.parent.glob(f"{glob.escape(mine)}*"):
        tag = left.name[len(mine):].split(".")[:2]  # its pid and start time
        if (len(tag) == 2 and tag[0].isdigit() and tag[1] != "None" and left.is_dir()
                and not owners.owner_alive(f"{host}/{tag[0]}/{tag[1]}")):
            shutil.rmtree(left, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{mine}{pid}.{start}.", dir=out.parent))
    try:
        yield staging
        out.mkdir(exist_ok=True)
        for f in sorted(staging.iterdir(), key=lambda p: p.name == last):
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
