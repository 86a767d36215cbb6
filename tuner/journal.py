"""Optuna's journal (one JSON record per storage operation) in a file, the default, or in a
PostgreSQL table, for searchers on several hosts.

Optuna's JournalStorage keeps the study in memory and only appends what changes, so
asking, telling and reading trials cost microseconds where SQLite through SQLAlchemy
costs milliseconds and grows with the study (`study.ask` reads every unfinished trial).
This backend appends under an exclusive `flock`, so several `tuner search` processes of
a host share one file, and does not fsync: a killed process loses nothing it wrote (the
page cache outlives it), the same guarantee as SQLite at `synchronous=NORMAL`; only a
power cut can lose the last writes. The format is Optuna's own, so `optuna-dashboard
<file>` and `JournalFileBackend` read it.

In PostgreSQL (`journal+postgresql://USER@HOST/DB`) the journal is a table of numbered
records. A trial costs a few single-row inserts and one read of the records since the
last, where Optuna's relational storage on the same server spends ~60 ms of the
searcher's CPU per trial in its ORM (see tools/storage_cost.py).
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


class JournalPostgres(BaseJournalBackend):
    """Records in one table, numbered from 0 in the order they commit: an append takes a
    transaction-scoped advisory lock, so numbers are given out one writer at a time and, at
    READ COMMITTED, a reader never sees a record while an earlier one is uncommitted (it would
    skip it for good).

    A record is the journal file's JSON text (jsonb would refuse NaN and reshape numbers) with a
    unique id, so an append retried after a broken connection, which may have committed or not,
    is not written twice. A session that goes silent holding the lock (a stopped process, a lost
    host) is ended by the server within seconds rather than holding every searcher's writes."""

    TABLE = "tuner_journal"
    LOCK = 0x7475_6E65  # the advisory lock's key ("tune")
    TRIES = 4
    CONNECT = {"options": "-c idle_in_transaction_session_timeout=10s -c lock_timeout=30s",
               "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
               "connect_timeout": 20}

    def __init__(self, dsn: str):
        self.dsn = dsn
        self._conn = None

        def create(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self.LOCK,))  # the first searchers race here
                conn.execute(f"CREATE TABLE IF NOT EXISTS {self.TABLE} "
                             "(id bigint PRIMARY KEY, uid uuid UNIQUE NOT NULL, log text NOT NULL)")

        self._retry(create)

    def __getstate__(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "_conn": None}

    def _retry(self, work):
        """`work(connection)`, again on a fresh connection after a connection or lock-wait error."""
        import time

        import psycopg

        for attempt in range(self.TRIES):
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self.dsn, autocommit=True, **self.CONNECT)
                self._conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            try:
                return work(self._conn)
            except psycopg.OperationalError:
                self._conn.close()
                if attempt == self.TRIES - 1:
                    raise
                time.sleep(attempt + 1)

    def read_logs(self, log_number_from: int) -> Iterable[dict[str, Any]]:
        rows = self._retry(lambda conn: conn.execute(f"SELECT log FROM {self.TABLE} WHERE id >= %s ORDER BY id",
                                                     (log_number_from,)).fetchall())
        return [json.loads(row[0]) for row in rows]

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        import uuid

        rows = [(uuid.uuid4(), json.dumps(log, separators=(",", ":"))) for log in logs]

        def append(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self.LOCK,))
                if conn.execute(f"SELECT 1 FROM {self.TABLE} WHERE uid = %s", (rows[0][0],)).fetchone():
                    return  # a try whose connection broke at its commit had committed
                first = conn.execute(f"SELECT coalesce(max(id) + 1, 0) FROM {self.TABLE}").fetchone()[0]
                with conn.cursor() as cur:
                    cur.executemany(f"INSERT INTO {self.TABLE} (id, uid, log) VALUES (%s, %s, %s)",
                                    [(first + i, uid, log) for i, (uid, log) in enumerate(rows)])

        if rows:
            self._retry(append)


POSTGRES_SCHEME = "journal+postgresql://"


def storage(url: str | os.PathLike):
    """Optuna's JournalStorage over a file (a path) or a PostgreSQL table (journal+postgresql://)."""
    from optuna.storages import JournalStorage

    url = str(url)
    if url.startswith(POSTGRES_SCHEME):
        return JournalStorage(JournalPostgres("postgresql://" + url[len(POSTGRES_SCHEME):]))
    if "://" in url:
        from tuner.errors import TunerError

        raise TunerError(f"--storage {url}: a journal is a file's path or {POSTGRES_SCHEME}USER@HOST/DB")
    return JournalStorage(JournalFile(url))
