"""A damaged journal file: every intact record is read, each damaged line is warned about once by
its number, searches go on appending to it, and a reader that read before agrees with a fresh one."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from tuner.cli import main as cli
from tuner.store import journal
from tuner.store import study

SPACE = {"a": CategoricalDistribution([1, 2, 3]), "b": CategoricalDistribution(["x", "y"])}
REC = Path(__file__).parent / "data" / "h100-giou-bf16-u8.jsonl"

DAMAGE = {
    "garbage": b"garbage, not a record\n",
    "NUL bytes": b"\0" * 64 + b"\n",
    "random bytes": bytes(random.Random(7).choice(range(11, 256)) for _ in range(300)) + b"\n",
    "JSON that is no record": b'{"op": 1, "worker_id": "w"}\n',
    "a JSON list": b"[1, 2]\n",
    "not UTF-8": b'{"op_code": 2, "worker_id": "\xff\xfe", "study_id": 0, "user_attr": {"k": 1}}\n',
    "a record without its fields": b'{"op_code": 6, "worker_id": "w"}\n',
    "an empty line": b"\n",
}


@pytest.fixture(autouse=True)
def _quiet_optuna():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _search(path: Path, n: int, first: int = 0, name: str = "s") -> None:
    """n finished trials, values first, first + 1, ...: asked as Optuna's samplers do (a record per
    parameter) and claimed as `tuner search` does (parameters in the creation)."""
    st = optuna.create_study(study_name=name, storage=journal.storage(path), load_if_exists=True)
    for i in range(first, first + n):
        t = st.ask(SPACE) if i % 2 else study.claim(st, {"a": 1 + i % 3, "b": "x"}, SPACE, {"variant": f"v{i}"})
        st.tell(t, float(i))


def _complete(st) -> dict[tuple[int, int], float]:
    """(study id, trial number): value of every finished trial of a storage."""
    return {(s._study_id, t.number): t.value for s in st.get_all_studies()
            for t in st.get_all_trials(s._study_id) if t.state.name == "COMPLETE"}


def _finished(path: Path) -> dict[tuple[int, int], float]:
    return _complete(journal.storage(path))


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _messages(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, journal.JournalDamageWarning)]


@pytest.mark.parametrize("where", ["start", "middle", "end"])
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_line_is_skipped_with_one_warning_and_the_search_goes_on(tmp_path, kind, where):
    path = tmp_path / "tuner.journal"
    _search(path, 6)
    before = _finished(path)
    lines = _lines(path)
    at = {"start": 0, "middle": len(lines) // 2, "end": len(lines)}[where]
    path.write_bytes(b"".join(lines[:at] + [DAMAGE[kind]] + lines[at:]))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        st = journal.storage(path)
        assert _complete(st) == before and journal.damaged_lines(st) == [at + 1]
        _search(path, 2, first=6)  # a search goes on appending to the damaged file
        assert _finished(path) == {**before, (0, 6): 6.0, (0, 7): 7.0}  # a fresh reader reads it all
        assert _complete(st) == {**before, (0, 6): 6.0, (0, 7): 7.0}  # and so does the first, reading on
    [message] = _messages(record)  # once in this process, however many storages read it
    assert message.startswith(f"{path} line {at + 1}: damaged record skipped (")


@pytest.mark.parametrize("searchers", [1, 2])
def test_a_damaged_record_costs_at_most_its_own_trial(tmp_path, searchers):
    """Every line in turn overwritten: a lost creation would shift the id of every later study or
    trial; the ids its writers saw are kept, so every other finished trial keeps its number and
    value. With two searches side by side (two studies, creations interleaved) as with one."""
    path = tmp_path / "tuner.journal"
    if searchers == 1:
        _search(path, 5)
    else:
        one = optuna.create_study(study_name="one", storage=journal.storage(path))
        two = optuna.create_study(study_name="two", storage=journal.storage(path))
        for i in range(3):
            a, b = one.ask(SPACE), study.claim(two, {"a": 1, "b": "y"}, SPACE, {"variant": f"v{i}"})
            c = one.ask(SPACE)
            one.tell(a, float(i))
            two.tell(b, 10.0 + i)
            one.tell(c, 20.0 + i)
    before = _finished(path)
    lines = _lines(path)
    damaged = tmp_path / "damaged.journal"
    for i in range(len(lines)):
        damaged.write_bytes(b"".join(lines[:i] + [b"garbage\n"] + lines[i + 1:]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", journal.JournalDamageWarning)
            st = journal.storage(damaged)
            after = _complete(st)
        lost = [key for key in before if after.get(key) != before[key]]
        assert len(lost) <= 1 and set(after) <= set(before), (i, lines[i], lost)
        trials = st.get_all_trials(lost[0][0]) if lost else []
        if lost and lost[0][1] < len(trials):  # (the last creation lost leaves no trace)
            trial = trials[lost[0][1]]  # not finished, or failed with a reason: no search runs it again
            assert trial.state.name == "RUNNING" or trial.user_attrs["reason"] == journal.LOST_REASON, (i, lines[i])
    # the study of a damaged creation keeps its trials under a stand-in's name
    damaged.write_bytes(b"".join([b"garbage\n"] + lines[1:]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", journal.JournalDamageWarning)
        names = [s.study_name for s in journal.storage(damaged).get_all_studies()]
    assert names[0] == "lost study 0"


def test_a_journal_written_elsewhere_keeps_its_trials_too(tmp_path):
    """Optuna's own backend writes no ids: a lost creation is seen by the records of its trial."""
    path = tmp_path / "optuna.journal"
    st = optuna.create_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    for i in range(5):
        t = st.ask(SPACE)
        st.tell(t, float(i))
    before = _finished(path)
    lines = _lines(path)
    creations = [i for i, line in enumerate(lines) if json.loads(line)["op_code"] == 4]
    path.write_bytes(b"".join(lines[:creations[1]] + [b"\0\0\0\n"] + lines[creations[1] + 1:]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", journal.JournalDamageWarning)
        after = _finished(path)
    assert after == {key: value for key, value in before.items() if key != (0, 1)}


@pytest.mark.parametrize("how", ["partial line", "killed writer"])
def test_a_writer_killed_mid_line_costs_nothing_finished(tmp_path, how):
    path = tmp_path / "tuner.journal"
    _search(path, 4)
    before = _finished(path)
    reader = optuna.load_study(study_name="s", storage=journal.storage(path))
    assert len(reader.get_trials()) == 4
    half = b'{"op_code":4,"worker_id":"killed","study_id":0,"datetime_start":"2024-01-01T00:'
    if how == "partial line":
        with open(path, "ab") as f:
            f.write(half)
    else:  # a process that holds the lock, writes half its line and dies
        code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND); "
                "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, sys.argv[2].encode()); os._exit(9)")
        assert subprocess.run([sys.executable, "-c", code, str(path), half.decode()], timeout=60).returncode == 9
    n = len(_lines(path))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _finished(path) == before  # until an append ends it, the line is being written
        assert _messages(record) == []
        _search(path, 2, first=4)  # another searcher appends: its record starts a line of its own
        assert _lines(path)[n - 1] == half + b"\n"
        assert _finished(path) == {**before, (0, 4): 4.0, (0, 5): 5.0}
        assert {t.number: t.value for t in reader.get_trials()} == {n: v for (_, n), v in _finished(path).items()}
    assert _messages(record) == [f"{path} line {n}: damaged record skipped (not JSON)"]


def test_a_reader_reading_on_agrees_with_a_fresh_one(tmp_path):
    """Records are numbered from the file's whole lines alone: a reader that read before the damage
    and the appends after it numbers them as a reader that reads it all at once, in any process."""
    path = tmp_path / "tuner.journal"
    _search(path, 3)
    backend = journal.JournalFile(path)
    first = backend.read_logs(0)
    reader = optuna.load_study(study_name="s", storage=journal.storage(path))
    reader.get_trials()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", journal.JournalDamageWarning)
        with open(path, "ab") as f:
            f.write(b"garbage\n")
        assert backend.read_logs(len(first)) == []
        with open(path, "ab") as f:
            f.write(b'{"op_code": 4, "study')  # a killed writer's partial line
        assert backend.read_logs(len(first)) == []
        _search(path, 3, first=3)
        more = backend.read_logs(len(first))
        other = journal.JournalFile(path)  # another process's
        fresh = other.read_logs(0)
        assert first + more == fresh
        assert backend.read_logs(0) == fresh and backend.read_logs(5) == fresh[5:]  # from any number
        assert backend.damaged == other.damaged == [len(first) + 1, len(first) + 2]

        def trials(st):
            return [(t.number, t.state, t.value, t.params) for t in st.get_trials()]

        assert trials(reader) == trials(optuna.load_study(study_name="s", storage=journal.storage(path)))


def test_a_creation_damaged_while_a_searcher_runs_keeps_the_ids_both_see(tmp_path):
    """The searcher read the creation before it was damaged, a reader started after sees it lost:
    the trials made after, by either, get the same ids, so each reaches its own trial."""
    path = tmp_path / "tuner.journal"
    _search(path, 3)
    searcher = optuna.load_study(study_name="s", storage=journal.storage(path))
    searcher.get_trials()
    lines = _lines(path)
    creation = [i for i, line in enumerate(lines) if json.loads(line)["op_code"] == 4][1]  # trial 1's
    lines[creation] = b"x" * (len(lines[creation]) - 1) + b"\n"
    path.write_bytes(b"".join(lines))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", journal.JournalDamageWarning)
        later = optuna.load_study(study_name="s", storage=journal.storage(path))
        for i in range(3, 7):
            st = searcher if i % 2 else later
            t = st.ask(SPACE)
            st.tell(t, float(i))
        expected = {n: float(n) for n in range(7) if n != 1}
        for st in (searcher, later, optuna.load_study(study_name="s", storage=journal.storage(path))):
            assert {t.number: t.value for t in st.get_trials() if t.number != 1} == expected
        assert later.get_trials()[1].state.name == "FAIL"


def test_each_damaged_line_is_warned_about_once(tmp_path):
    path = tmp_path / "tuner.journal"
    _search(path, 2)
    with open(path, "ab") as f:
        f.write(b"junk\n")
    junk = len(_lines(path))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        st = journal.storage(path)
        s = optuna.load_study(study_name="s", storage=st)
        for _ in range(3):
            s.get_trials()
        st._backend.read_logs(0)  # a read from the start finds it again
        _search(path, 1, first=2)
        with open(path, "ab") as f:
            f.write(b"more junk\n\xff\n")
        for _ in range(3):
            s.get_trials()
        later = len(_lines(path)) - 1
        assert journal.damaged_lines(st) == [junk, later, later + 1]
        assert journal.damaged_lines(journal.storage(path)) == [junk, later, later + 1]  # no warning again
        assert journal.damaged_lines(optuna.storages.InMemoryStorage()) == []
    assert _messages(record) == [f"{path} line {junk}: damaged record skipped (not JSON)",
                                 f"{path} lines {later}-{later + 1}: 2 damaged records skipped (not JSON, not UTF-8)"]


def test_a_value_optuna_cannot_replay_is_skipped_with_its_line(tmp_path):
    """A line that is a record but whose values were damaged (a date that is none): Optuna's replay
    would raise on every read; the record is skipped, a creation's stand-in keeps the later ids."""
    path = tmp_path / "tuner.journal"
    _search(path, 4)
    before = _finished(path)
    lines = _lines(path)
    creation = [i for i, line in enumerate(lines) if json.loads(line)["op_code"] == 4][1]
    lines[creation] = lines[creation].replace(b'"datetime_start":"', b'"datetime_start":"not a date ')
    path.write_bytes(b"".join(lines))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        st = journal.storage(path)
        assert _complete(st) == {key: value for key, value in before.items() if key != (0, 1)}
        assert journal.damaged_lines(st) == [creation + 1]
    assert _messages(record) == [f"{path} line {creation + 1}: damaged record skipped "
                                 "(Optuna cannot replay it: ValueError)"]


def test_reading_a_missing_journal_makes_nothing(tmp_path):
    path = tmp_path / "home" / "studies" / "tuner.journal"
    st = journal.storage(path)
    assert optuna.get_all_study_summaries(st) == []
    with pytest.raises(KeyError):
        optuna.load_study(study_name="s", storage=st)
    assert not (tmp_path / "home").exists()
    optuna.create_study(study_name="s", storage=st)  # the first write makes the folder and the file
    assert [s.study_name for s in optuna.get_all_study_summaries(journal.storage(path))] == ["s"]


def test_the_command_line_shows_a_damaged_journal_with_one_warning_line(tuner_home, capsys):
    path = tuner_home / "tuner.journal"
    argv = ["--storage", str(path)]
    assert cli.main(["search", "--gpu", "H100", "--simulate", str(REC), "--trials", "12", "--quiet", *argv]) == 0
    name = optuna.get_all_study_names(journal.storage(path))[0]
    capsys.readouterr()
    assert cli.main(["show", "--study", name, *argv]) == 0
    intact = capsys.readouterr().out
    lines = _lines(path)
    path.write_bytes(b"".join(lines[:20] + [b"\0garbage\n"] + lines[20:]))
    # as a process: what reaches its stderr, through the command line's own format for warnings
    env = {**os.environ, "TUNER_HOME": str(tuner_home), "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(sys.path)}
    damaged = subprocess.run([sys.executable, "-m", "tuner", "show", "--study", name, *argv], env=env,
                             capture_output=True, text=True, timeout=120)
    assert damaged.returncode == 0 and f"study {name}" in intact and "damaged" not in intact
    # the same study, and how many records were skipped where
    assert damaged.stdout == intact + f"damaged records skipped: 1 (lines 21 of {path})\n"
    assert damaged.stderr == f"tuner show: warning: {path} line 21: damaged record skipped (NUL bytes)\n"
    with pytest.warns(journal.JournalDamageWarning, match="line 21: damaged record skipped"):
        assert cli.main(["list", *argv]) == 0
    assert name in capsys.readouterr().out
