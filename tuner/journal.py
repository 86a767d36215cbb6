"""The default study storage: Optuna's journal (one JSON line per storage operation) in a file.

Optuna's JournalStorage keeps the study in memory and only appends what changes, so
asking, telling and reading trials cost microseconds where SQLite through SQLAlchemy
costs milliseconds and grows with the study (`study.ask` reads every unfinished trial).
This backend appends under an exclusive `flock`, so several `tuner search` processes of
a host share one file, and does not fsync: a killed process loses nothing it wrote (the
page cache outlives it), the same guarantee as SQLite at `synchronous=NORMAL`; only a
power cut can lose the last writes. The format is Optuna's own, so `optuna-dashboard
<file>` and `JournalFileBackend` read it.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any, Iterable

from optuna.storages.journal import BaseJournalBackend


class JournalFile(BaseJournalBackend):
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch(exist_ok=True)
        self._read = (0, 0)  # (log number, byte offset) of the first line not read yet

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        number, offset = self._read if log_number_from >= self._read[0] else (0, 0)
        logs = []
        with open(self.path, "rb") as f:
            f.seek(offset)
            for line in f:
                if not line.endswith(b"\n"):
                    break  # being written now: read it next time
                if number >= log_number_from:
                    logs.append(json.loads(line))
                number += 1
                offset += len(line)
        self._read = max(self._read, (number, offset))
        return logs

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        with open(self.path, "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                f.write(data)  # one write of whole lines, at the end (O_APPEND)
                f.flush()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


def storage(path: str | os.PathLike):
    from optuna.storages import JournalStorage

    return JournalStorage(JournalFile(path))
