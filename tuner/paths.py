"""Where builds and studies live: $TUNER_HOME (default: the current folder)."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("TUNER_HOME") or Path.cwd())


def variants_dir() -> Path:
    return home() / "variants"


def studies_dir() -> Path:
    return home() / "studies"
