"""Where things live. $TUNER_HOME (default: the current folder) holds studies, exports and
reports; builds (variants and the torch bindings) go to a per-user cache shared by every
home: $TUNER_CACHE, else $XDG_CACHE_HOME/tuner, else ~/.cache/tuner."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("TUNER_HOME") or Path.cwd())


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
