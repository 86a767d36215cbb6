"""The default study storage: Optuna's journal in a file (tuner.journal)."""

import multiprocessing as mp

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from tuner import journal, study

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


def test_a_line_being_written_is_read_once_it_is_whole(tmp_path):
    path = tmp_path / "j"
    backend = journal.JournalFile(path)
    backend.append_logs([{"op": 1}, {"op": 2}])
    with open(path, "ab") as f:
        f.write(b'{"op": 3')  # a writer mid-line
    assert list(backend.read_logs(0)) == [{"op": 1}, {"op": 2}]
    with open(path, "ab") as f:
        f.write(b"}\n")
    assert list(backend.read_logs(2)) == [{"op": 3}]
    assert list(backend.read_logs(0)) == [{"op": 1}, {"op": 2}, {"op": 3}]


def test_the_default_storage_is_the_journal_but_an_existing_sqlite_home_keeps_its_file(tuner_home):
    assert study.storage_url().endswith("studies/tuner.journal")
    (tuner_home / "studies" / "tuner.journal").unlink(missing_ok=True)
    (tuner_home / "studies" / "tuner.db").touch()
    assert study.storage_url() == f"sqlite:///{tuner_home / 'studies' / 'tuner.db'}"
