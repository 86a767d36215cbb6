"""Measurement logs: one JSON object per evaluated variant, appended as it happens.

A search writes every evaluation here (studies/<study>.jsonl); `tuner search
--simulate FILE` replays such a file instead of a GPU. Appends are flushed and
fsynced one line at a time, so a kill loses at most the line being written, and
a truncated last line is skipped on reading. Any other line that is not a JSON object (a cut
line that a later append ended, bytes that are not UTF-8, an editor's mistake), or whose timings
are not finite numbers of µs at least 0 (NaN, inf, a word), is skipped with one
RecordDamageWarning naming the file and the line, once per process: never used as a measurement.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Iterator

from tuner.errors import TunerError

OBJECTIVES = ("fwd", "bwd", "fwd+bwd")
EXPECTED = "expected a measurement log (a search's studies/<study>.jsonl)"


class RecordDamageWarning(UserWarning):
    """A damaged line of a measurement log skipped (the command line shows it in one line)."""


_warned: set[tuple[str, int]] = set()  # (log, line) warned about in this process


def objective_value(result: dict, objective: str) -> float:
    """What a search minimises, from a result's (or a record's) timings, in µs."""
    fwd = result.get("fwd", {}).get("median_us", 0.0)
    bwd = result.get("bwd", {}).get("median_us", 0.0)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[objective]


BASELINE = "baseline: torch"  # the baseline's name among a retime's timings (no variant is named so)
# What the op pays beside a variant's timed backward (e.g. zeroing a weight's gradient that the variant adds into),
# timed with the baseline and kept in its timings as "variant_extra"
BASELINE_EXTRA = "baseline: the op's share beside a variant's backward"


def served_by(timings: dict, baseline: dict | None, objective: str) -> str:
    """Who serves a tuned problem: "variant" where its winner beat the baseline (the torch op the
    family replaces, timed beside it) in the forward and in the objective, else "torch", so that
    neither an inference call nor a training step is slower than torch's. The variant's backward
    counts what the op pays beside it (the baseline's "variant_extra"). Without the baseline's
    timings (a simulated search, a family without one): "variant"."""
    if not baseline or "fwd" not in baseline or "fwd" not in timings:
        return "variant"
    if objective != "bwd" and timings["fwd"]["median_us"] >= baseline["fwd"]["median_us"]:
        return "torch"
    if objective != "fwd" and "bwd" in baseline and "bwd" in timings:
        extra = baseline.get("variant_extra", {}).get("median_us", 0.0)
        if objective_value(timings, objective) + extra >= objective_value(baseline, objective):
            return "torch"
    return "variant"


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


def writable(path: Path) -> None:
    """Make sure a log can be appended to (its folder made, the file opened for appending): an
    OSError naming it otherwise (a folder in its place, a read-only place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab"):
        pass


def read(path: Path, flag: str = "") -> Iterator[dict]:
    """The records of a log, in order (see the module's docstring for the lines skipped). A path
    that is not a file is a TunerError, raised here rather than on the first record; `flag` (the
    option that named the file) starts its message."""
    path = Path(path)
    if not path.is_file():
        raise TunerError(f"{flag} {path}: {'a folder' if path.is_dir() else 'no such file'}; {EXPECTED}".lstrip())
    return _records(path)


def read_some(path: Path, flag: str = "") -> list[dict]:
    """The records of a log that must hold at least one (a recording to replay or import)."""
    found = list(read(path, flag))
    if not found:
        raise TunerError(f"{flag} {path}: holds no measurement (no line is a measurement record); {EXPECTED}".lstrip())
    return found


def _records(path: Path) -> Iterator[dict]:
    damaged: list[tuple[int, str]] = []  # the run of damaged lines since the last record
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            record, why = _parse(raw)
            if record is not None:
                _warn(path, damaged)
                damaged = []
                yield record
            elif why and raw.endswith(b"\n"):  # a last line without its end is being written
                damaged.append((number, why))
    _warn(path, damaged)


def decode(raw: bytes) -> tuple[Any, str]:
    """The JSON value of a line of a file, or None and why it is not one (here and in the journal)."""
    try:
        return json.loads(raw.decode()), ""
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except (ValueError, RecursionError):
        return None, "not JSON"


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """The record on a line, or None and why it is damaged ("" for a blank line)."""
    if not raw.strip():
        return None, ""
    record, why = decode(raw)
    if why:
        return None, why
    if not isinstance(record, dict):
        return None, "not a JSON object"
    return (record, "") if _timed_plainly(record) else (None, "timings that are not finite µs at least 0")


TIMES = ("median_us", "spread_us", "min_us")  # a timing's times (tuner.measure.timing.Timing)


def _timed_plainly(record: dict) -> bool:
    """Whether each of a record's timings (fwd, bwd) holds its times as finite numbers at least 0:
    json reads NaN and Infinity, and a search would rank them."""
    for kind in ("fwd", "bwd"):
        if kind not in record:
            continue
        timing = record[kind]
        if not isinstance(timing, dict):
            return False
        for v in (timing[t] for t in TIMES if t in timing):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                return False
    return True


def runs(damaged: list[tuple[int, str]]) -> Iterator[tuple[list[tuple[int, str]], str]]:
    """Damaged (line, why) pairs grouped into runs of consecutive lines, each with its reasons
    joined: what a warning about a damaged file names (here and in the journal)."""
    groups: list[list[tuple[int, str]]] = []
    for n, why in damaged:
        if groups and groups[-1][-1][0] == n - 1:
            groups[-1].append((n, why))
        else:
            groups.append([(n, why)])
    for run in groups:
        yield run, ", ".join(dict.fromkeys(why for _, why in run))


def _warn(path: Path, damaged: list[tuple[int, str]]) -> None:
    """One warning per run of consecutive damaged lines, each line once per process (a recording
    is read again by every simulated run of `tuner samplers`)."""
    key = str(path.resolve())
    damaged = [(n, why) for n, why in damaged if (key, n) not in _warned]
    _warned.update((key, n) for n, _ in damaged)
    for run, whys in runs(damaged):
        lines = f"line {run[0][0]}" if len(run) == 1 else f"lines {run[0][0]}-{run[-1][0]} ({len(run)})"
        warnings.warn(f"{path} {lines}: not a measurement record, skipped ({whys})", RecordDamageWarning)
