"""Measurement logs: one JSON object per evaluated variant, appended as it happens.

A search writes every evaluation here (studies/<study>.jsonl); `tuner search
--simulate FILE` replays such a file instead of a GPU. Appends are flushed and
fsynced one line at a time, so a kill loses at most the line being written, and
a truncated last line is skipped on reading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

OBJECTIVES = ("fwd", "bwd", "fwd+bwd")


def objective_value(result: dict, objective: str) -> float:
    """What a search minimises, from a result's (or a record's) timings, in µs."""
    fwd = result.get("fwd", {}).get("median_us", 0.0)
    bwd = result.get("bwd", {}).get("median_us", 0.0)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[objective]


def append(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":  # a line cut short by a kill: end it, so this one stands alone
                line = "\n" + line
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


def read(path: Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
