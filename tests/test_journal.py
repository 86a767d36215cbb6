"""Optuna's journal as tuner keeps it: in a file (the default, tuner.journal) or a PostgreSQL
table; and the searchers' heartbeats in a study."""

import json
import multiprocessing as mp

import pytest

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from tuner.store import journal
from tuner.store import study
from tuner.search import heartbeat
from tuner.store.journal_postgres import JournalPostgres

SPACE = {"a": CategoricalDistribution([1, 2, 3]), "b": CategoricalDistribution(["x", "y"])}


def _search(path, n):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = optuna.load_study(study_name="s", storage=journal.storage(path))
    for _ in range(n):
        t = st.ask(SPACE)
        t.set_user_attr("pid", mp.current_process().pid)
        st.tell(t, float(t.params["a"]))


def test_processes_share_a_journal_and_optuna_reads_it(tmp_path):
    path = tmp_path / "tuner.journal"
    optuna.create_study(study_name="s", storage=journal.storage(path))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_search, args=(path, 15)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    trials = optuna.load_study(study_name="s", storage=journal.storage(path)).get_trials()
    assert len(trials) == 45 and sorted(t.number for t in trials) == list(range(45))
    assert all(t.state.name == "COMPLETE" and t.value == t.params["a"] for t in trials)
    # Optuna's own backend (what optuna-dashboard opens) reads the same file
    theirs = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    assert [t.params for t in theirs.get_trials()] == [t.params for t in trials]


def _attr(n: int) -> dict:
    """A record as Optuna writes them: a study's attribute."""
    return {"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {"n": n}}


def test_a_line_being_written_is_read_once_it_is_whole(tmp_path):
    path = tmp_path / "j"
    backend = journal.JournalFile(path)
    backend.append_logs([_attr(1), _attr(2)])
    with open(path, "ab") as f:
        f.write(json.dumps(_attr(3))[:-1].encode())  # a writer mid-line
    assert list(backend.read_logs(0)) == [_attr(1), _attr(2)]
    with open(path, "ab") as f:
        f.write(b"}\n")
    assert list(backend.read_logs(2)) == [_attr(3)]
    assert list(backend.read_logs(0)) == [_attr(1), _attr(2), _attr(3)]
    assert backend.damaged == []


@pytest.mark.parametrize("change", ["removed", "replaced", "cut short"])
def test_a_journal_removed_replaced_or_cut_under_a_reader_is_refused_at_once(tmp_path, change):
    """Read on from its old place, a new file gives no record (a search waited for its trials'
    results until its deadline, 13 minutes) and an append would give ids the file never made: the
    next read or append says what happened and what makes the study again."""
    from tuner.errors import TunerError

    path = tmp_path / "j"
    backend = journal.JournalFile(path)
    backend.append_logs([_attr(1), _attr(2)])
    assert list(backend.read_logs(0)) == [_attr(1), _attr(2)]
    if change == "cut short":
        path.write_bytes(path.read_bytes()[:10])
    else:
        path.unlink()
        if change == "replaced":
            journal.JournalFile(path).append_logs([_attr(9)])
    for call in (lambda: backend.read_logs(2), lambda: backend.append_logs([_attr(3)])):
        with pytest.raises(TunerError, match="removed, replaced or cut short .* --import-records"):
            call()
    assert journal.JournalFile(path).read_logs(0) == ([_attr(9)] if change == "replaced" else [])


def test_the_default_storage_is_the_journal_but_an_existing_sqlite_home_keeps_its_file(tuner_home):
    assert study.storage_url().endswith("studies/tuner.journal")
    (tuner_home / "studies" / "tuner.journal").unlink(missing_ok=True)
    (tuner_home / "studies").mkdir(exist_ok=True)  # naming the storage makes no folder
    (tuner_home / "studies" / "tuner.db").touch()
    assert study.storage_url() == f"sqlite:///{tuner_home / 'studies' / 'tuner.db'}"


def test_a_searcher_that_stops_beating_has_its_trials_run_again(tmp_path, monkeypatch):
    # the watches below run by hand, on a clock of their own: the beat's threads never watch meanwhile
    # (one on the real clock would fail the live trial on a slow machine)
    monkeypatch.setattr(heartbeat, "HEARTBEAT_S", 3600)
    studies = study
    st = studies.storage(str(tmp_path / "j.journal"))
    shared = optuna.create_study(study_name="s", storage=st)
    dists = {"x": CategoricalDistribution([1, 2])}
    live = studies.claim(shared, {"x": 1}, dists, {"owner": "other-host/1/1"})
    dead = studies.claim(shared, {"x": 2}, dists, {"owner": "other-host/2/2"})
    orphan = shared.ask(dists)  # killed between Optuna's ask and recording its owner
    beat = heartbeat.Heartbeat(shared, st)
    try:
        sid = st.get_study_id_from_name("s")
        for tag in ("other-host/1/1", "other-host/2/2"):
            st.set_study_system_attr(sid, beat.key(tag), 1)
        assert beat.watch(now=0.0) == []
        st.set_study_system_attr(sid, beat.key("other-host/1/1"), 2)  # alive: its beat moves
        assert beat.watch(now=heartbeat.GRACE_S - 1) == []
        st.set_study_system_attr(sid, beat.key("other-host/1/1"), 3)
        assert sorted(beat.watch(now=heartbeat.GRACE_S + 1)) == sorted([dead.number, orphan.number])
    finally:
        beat.close()
    trials = {t.number: t for t in shared.get_trials()}
    assert trials[live.number].state.name == "RUNNING"
    for n in (dead.number, orphan.number):
        assert trials[n].state.name == "FAIL" and studies.interrupted(trials[n])
    queued = [t for t in trials.values() if t.state.name == "WAITING"]
    assert sorted(t.user_attrs["retry_of"] for t in queued) == sorted([dead.number, orphan.number])
    assert beat.watch(now=2 * heartbeat.GRACE_S) == []  # failed once, not again


def test_the_journal_table_in_postgresql_keeps_records_in_commit_order(postgres_url):
    from tuner.store import journal

    dsn = "postgresql" + postgres_url[postgres_url.index("://"):]
    a, b = JournalPostgres(dsn), JournalPostgres(dsn)  # two searchers' connections
    a.append_logs([_attr(0), _attr(1)])
    b.append_logs([_attr(2)])
    assert [log["user_attr"]["n"] for log in b.read_logs(0)] == [0, 1, 2]
    assert [log["user_attr"]["n"] for log in a.read_logs(2)] == [2]
    assert a.read_logs(3) == []
    b.append_logs([{**_attr(3), "x": float("nan"), "big": 1e17}])  # as the journal file keeps them
    last = a.read_logs(3)[0]
    assert last["x"] != last["x"] and isinstance(last["big"], float)
    # a server that drops a searcher's connection: the next call reconnects, nothing is lost or doubled
    a._conn.execute("SELECT pg_terminate_backend(%s)", (b._conn.info.backend_pid,))
    b.append_logs([_attr(4)])
    assert [log["user_attr"]["n"] for log in a.read_logs(0)] == [0, 1, 2, 3, 4]
    # a row that is not a record is skipped, once, by its id; numbers stay the rows' ids
    a._conn.execute(f"UPDATE {a.TABLE} SET log = 'garbage' WHERE id = 2")
    with pytest.warns(journal.JournalDamageWarning, match=f"table {a.TABLE} id 2: damaged record skipped"):
        logs = a.read_logs(0)
    assert [log.get("user_attr", {}).get("n") for log in logs] == [0, 1, None, 3, 4] and a.damaged == [2]
    st = journal.storage("journal+" + postgres_url.replace("+psycopg", ""))  # Optuna replays the rest
    assert st.get_all_studies() == []


def test_a_journal_url_of_another_kind_is_refused():
    from tuner.errors import TunerError

    with pytest.raises(TunerError, match="journal\\+postgresql://"):
        study.storage("journal+postgres://me@host/db")


def test_a_refused_connection_is_tried_again(monkeypatch):
    """A server that refuses a reconnection for a moment (restarting) costs a retry, not the search;
    one that stays down is reported after the last try, and a first connection refused at once."""
    import time

    import psycopg

    calls = []

    class Conn:
        closed = False
        isolation_level = None

        def close(self):
            self.closed = True

    def connect(dsn, **kw):
        calls.append(dsn)
        if len(calls) == 1:
            raise psycopg.OperationalError("connection refused")
        return Conn()

    monkeypatch.setattr(psycopg, "connect", connect)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    j = JournalPostgres.__new__(JournalPostgres)
    j.dsn, j._conn, j._connected = "postgresql://u@h/db", None, False
    with pytest.raises(psycopg.OperationalError, match="refused"):  # the first connection: a wrong URL, at once
        j._retry(lambda conn: "never")
    assert len(calls) == 1
    j._connected = True  # connected before, then the server went away
    assert j._retry(lambda conn: "done") == "done" and len(calls) == 2

    def down(dsn, **kw):
        calls.append(dsn)
        raise psycopg.OperationalError("connection refused")

    calls.clear()
    j._conn = None
    monkeypatch.setattr(psycopg, "connect", down)
    with pytest.raises(psycopg.OperationalError, match="refused"):
        j._retry(lambda conn: "never")
    assert len(calls) == JournalPostgres.TRIES
