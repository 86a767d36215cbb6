"""The journal in a PostgreSQL table (`journal+postgresql://USER@HOST/DB`), for searchers on
several hosts: see tuner/store/journal.py for the format and how damaged records are skipped."""

from __future__ import annotations

import json
from typing import Any

from optuna.storages.journal import BaseJournalBackend

from tuner.store.journal_records import note, parse, unreplayable


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
        self.damaged: list[int] = []  # ids of the rows skipped, as read so far
        self._ids: list[int] = []  # the id of each row the last read gave
        self._conn = None
        self._connected = False  # once: a refused reconnection is retried, a refused first connection not

        def create(conn):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self.LOCK,))  # the first searchers race here
                conn.execute(f"CREATE TABLE IF NOT EXISTS {self.TABLE} "
                             "(id bigint PRIMARY KEY, uid uuid UNIQUE NOT NULL, log text NOT NULL)")

        self._retry(create)

    def __getstate__(self) -> dict[str, Any]:
        return {"dsn": self.dsn, "damaged": self.damaged, "_ids": [], "_conn": None, "_connected": True}

    def _retry(self, work):
        """`work(connection)`, again on a fresh connection after a connection or lock-wait error,
        a refused reconnection included (a server restarting): TRIES tries over about 6 s. The
        first connection of all is not retried: a wrong URL or host is reported at once."""
        import time

        import psycopg

        for attempt in range(self.TRIES):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = None
                    self._conn = psycopg.connect(self.dsn, autocommit=True, **self.CONNECT)
                    self._conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
                    self._connected = True
                return work(self._conn)
            except psycopg.OperationalError:
                if self._conn is not None:
                    self._conn.close()
                if attempt == self.TRIES - 1 or not self._connected:
                    raise
                time.sleep(attempt + 1)

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        rows = self._retry(lambda conn: conn.execute(f"SELECT id, log FROM {self.TABLE} WHERE id >= %s ORDER BY id",
                                                     (log_number_from,)).fetchall())
        logs, found = [], []
        for n, text in rows:
            record, why = parse(text.encode())
            if record is None and n not in self.damaged:
                found.append((n, why))
            logs.append(dict(NOOP) if record is None else record)  # numbers are ids: one record a row
        self._ids = [n for n, _ in rows]
        if found:
            note(self.damaged, f"{self.dsn} {self.TABLE}", f"table {self.TABLE}", "id", found)
        return logs

    def refused(self, index: int, exc: Exception) -> None:
        """Optuna's replay refused the `index`th record of the last read."""
        if self._ids[index] not in self.damaged:
            note(self.damaged, f"{self.dsn} {self.TABLE}", f"table {self.TABLE}", "id",
                  [(self._ids[index], unreplayable(exc))])

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


# What a damaged row gives Optuna: an attribute for a study that does not exist, which its
# replay ignores (a record from another worker), so that numbers stay the rows' ids.
NOOP: dict[str, Any] = {"op_code": 2, "worker_id": "", "study_id": -1, "user_attr": {}}
