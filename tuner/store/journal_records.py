"""What the journal's two backends (a file, tuner/store/journal.py; a PostgreSQL table,
tuner/store/journal_postgres.py) share about records: which are Optuna's, and how damage found in
them is noted and warned about (once per process and place)."""

from __future__ import annotations

import bisect
import warnings
from typing import Any

from tuner.store.records import decode, runs


class JournalDamageWarning(UserWarning):
    """A damaged record skipped (the command line shows it in one line: tuner CMD: warning: ...)."""


# Optuna's operations (JournalOperation) and the fields its replay reads from each: a record
# without them would raise in the middle of the replay.
FIELDS: dict[int, tuple[str, ...]] = {
    0: ("study_name", "directions"), 1: ("study_id",), 2: ("study_id", "user_attr"),
    3: ("study_id", "system_attr"), 4: ("study_id", "datetime_start"),
    5: ("trial_id", "param_name", "param_value_internal", "distribution"),
    6: ("trial_id", "state", "values"), 7: ("trial_id", "step", "intermediate_value"),
    8: ("trial_id", "user_attr"), 9: ("trial_id", "system_attr"), 10: ()}

# The types Optuna's replay stores as given (a value of another type replays, then breaks every
# reader of the study: a trial whose value is a string cannot be compared with the others).
_NUMBER = (int, float)
TYPES: dict[str, Any] = {
    "directions": lambda v: isinstance(v, list) and all(type(d) is int for d in v),
    "user_attr": lambda v: isinstance(v, dict), "system_attr": lambda v: isinstance(v, dict),
    "state": lambda v: type(v) is int, "step": lambda v: type(v) is int,
    "values": lambda v: v is None or (isinstance(v, list) and all(isinstance(x, _NUMBER) and not isinstance(x, bool)
                                                                  for x in v)),
    "intermediate_value": lambda v: v is None or (isinstance(v, _NUMBER) and not isinstance(v, bool)),
    "param_name": lambda v: isinstance(v, str), "datetime_start": lambda v: v is None or isinstance(v, str),
    "datetime_complete": lambda v: v is None or isinstance(v, str)}

# The study attributes a search writes (tuner.search.recording, tuner.search.finalists) and every
# command reads: one of another type broke show, list, export-best and the search itself.
STUDY_ATTRS: dict[str, Any] = {
    "family": lambda v: isinstance(v, str), "objective": lambda v: v is None or isinstance(v, str),
    "problem": lambda v: isinstance(v, dict), "gpu": lambda v: isinstance(v, dict),
    "rejected": lambda v: isinstance(v, dict), "baseline": lambda v: v is None or isinstance(v, dict),
    "winner": lambda v: v is None or isinstance(v, dict),
    "retimed": lambda v: isinstance(v, list) and all(isinstance(row, dict) for row in v)}

_warned: set[tuple[str, int]] = set()  # (journal, line) warned about in this process


def parse(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """The record on a line, or None and why the line is damaged."""
    if b"\0" in line:
        return None, "NUL bytes"
    record, why = decode(line)
    if why:
        return None, why
    op = record.get("op_code") if isinstance(record, dict) else None
    if (not isinstance(op, int) or op not in FIELDS or "worker_id" not in record
            or not all(key in record for key in FIELDS[op])
            or not all(isinstance(record.get(key, 0), int) for key in ("study_id", "trial_id"))
            or not isinstance(record.get("study_name", ""), str)):
        return None, "not a record"
    wrong = next((key for key, fits in TYPES.items() if key in record and not fits(record[key])), None)
    if wrong:
        return None, f"{wrong} of the wrong type"
    if op == 2:  # a study's attribute
        wrong = next((key for key, value in record["user_attr"].items()
                      if key in STUDY_ATTRS and not STUDY_ATTRS[key](value)), None)
        if wrong:
            return None, f"study attribute {wrong} of the wrong type"
    return record, ""


def _warn(where: str, unit: str, damaged: list[tuple[int, str]]) -> None:
    """One warning per run of consecutive damaged lines (or rows)."""
    for run, whys in runs(damaged):
        if len(run) == 1:
            text = f"{where} {unit} {run[0][0]}: damaged record skipped ({whys})"
        else:
            text = f"{where} {unit}s {run[0][0]}-{run[-1][0]}: {len(run)} damaged records skipped ({whys})"
        warnings.warn(text, JournalDamageWarning)


def note(damaged: list[int], key: str, where: str, unit: str, found: list[tuple[int, str]]) -> None:
    """Add damage found for the first time to the sorted list `damaged`, and warn about what this
    process has not warned about yet (another storage on the same journal may have)."""
    for n, _ in found:
        bisect.insort(damaged, n)
    found = [(n, why) for n, why in found if (key, n) not in _warned]
    _warned.update((key, n) for n, _ in found)
    _warn(where, unit, found)


def unreplayable(exc: Exception) -> str:
    return f"Optuna cannot replay it: {type(exc).__name__}"
