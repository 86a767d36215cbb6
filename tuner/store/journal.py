"""Optuna's journal (one JSON record per storage operation) in a file, the default, or in a
PostgreSQL table, for searchers on several hosts.

Optuna's JournalStorage keeps the study in memory and only appends what changes, so
asking, telling and reading trials cost microseconds where SQLite through SQLAlchemy
costs milliseconds and grows with the study (`study.ask` reads every unfinished trial).
This backend appends under an exclusive `flock`, so several `tuner search` processes of
a host share one file, and does not fsync: a killed process loses nothing it wrote (the
page cache outlives it), the same guarantee as SQLite at `synchronous=NORMAL`; only a
power cut can lose the last writes. The format is Optuna's own, so `optuna-dashboard
<file>` and `JournalFileBackend` read it. The file and its folder are made by the first
append: reading a missing file finds no studies and makes nothing.

A damaged line (not UTF-8, not JSON, NUL bytes, not one of Optuna's records, or a record
Optuna's replay refuses: a disk that filled up, a power cut, an editor) is skipped with one
JournalDamageWarning naming the file and the line, once per process, and every intact record
is kept; `damaged_lines` lists the lines skipped. Records are numbered for Optuna's replay in
the order they are given to it, a function of the file's whole lines alone, so a full read and
incremental reads, in any process, number them alike. An append first ends a partial last line
(a writer killed mid-line: writers take turns under the lock, so none is writing it), so that
its records start a line of their own; a reader leaves a partial last line for its next read
(it is being written, or the next append ends it and it is a damaged line). A file none of whose
whole lines is a record is some other file, not a damaged journal: it is refused, never appended to.

Optuna numbers studies and trials in the order their creations replay, so a creation lost in a
damaged line would shift the id of every later one, and their records would reach the wrong
study or trial. The creations written here carry the id they get and a trial its number in its
study ("tuner_id", "tuner_number": Optuna ignores them); where these, or a record naming a study
or trial not made yet, show creations lost, stand-ins take their ids (a study "lost study N"; a
trial failed with a reason, so that its later records are refused), and every other study and
trial keeps its own. A damaged record thus costs at most its own trial. Journals written
elsewhere carry no ids: there a lost creation is seen only when a record names what it made.

In PostgreSQL (`journal+postgresql://USER@HOST/DB`) the journal is a table of numbered
records. A trial costs a few single-row inserts and one read of the records since the
last, where Optuna's relational storage on the same server spends ~60 ms of the
searcher's CPU per trial in its ORM (see tools/storage_cost.py). A row that is not a record
is skipped in the same way, with a warning naming its id.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend

from tuner.errors import TunerError
from tuner.store.journal_records import JournalDamageWarning, note, parse, unreplayable  # noqa: F401 (the warning: tuner.journal's)


CREATE_STUDY, DELETE_STUDY, CREATE_TRIAL = 0, 1, 4
ID = "tuner_id"  # the id a creation gets, as its writer saw the journal
NUMBER = "tuner_number"  # and a trial's number in its study
LOST_REASON = "lost in a damaged journal line"
RECORD_BYTES = 32  # fewer than any record takes: a damaged line of n bytes held at most n // 32 + 1

@dataclasses.dataclass
class _Place:
    """A point in the journal file, after whole lines, and what Optuna made of the lines before:
    the ids it gave out, as its replay gives them (a study per new name, a trial per creation in
    a live study)."""

    offset: int = 0
    line: int = 0
    number: int = 0  # records given to Optuna
    studies: dict[int, str] = dataclasses.field(default_factory=dict)  # live studies' names by id
    next_study: int = 0
    trials: int = 0
    counts: dict[int, int] = dataclasses.field(default_factory=dict)  # trials by study (their numbers)
    recent: list[int] = dataclasses.field(default_factory=list)  # studies by their last trial made, oldest first
    marked: bool = False  # the last creation carried its id: the next one will show a loss
    slack: int = 0  # stand-ins the damage so far can account for: a damaged id makes none

    def copy(self) -> _Place:
        new = object.__new__(_Place)  # dataclasses.replace costs more than the rest of a read
        new.__dict__ = {**self.__dict__, "studies": dict(self.studies), "counts": dict(self.counts),
                        "recent": list(self.recent)}
        return new

    def take(self, record: dict[str, Any]) -> list[dict[str, Any]]:
        """What Optuna replays for an intact record: first a stand-in for each creation that it
        shows was lost (its id is beyond the next, or it names a study or trial not made yet)."""
        op, made, out = record["op_code"], record.get(ID), []
        made = made if isinstance(made, int) else None
        if record.get("study_id", -1) >= self.next_study:
            self._fill(out, record["study_id"] + 1 - self.next_study, lambda k: self._lost_study())
        if record.get("trial_id", -1) >= self.trials and not self.marked:
            # Where creations carry their ids the next one shows the loss, and in which study;
            # else most likely in the study of the trial made before (a trial's record names none).
            there = self.recent[-1] if self.recent else max(self.studies, default=None)
            self._fill(out, record["trial_id"] + 1 - self.trials, lambda k: self._lost_trial(there))
        if op == CREATE_STUDY and record["study_name"] not in self.studies.values():
            if made is not None and made < self.next_study:
                # Its writer knew this name by an id whose creation was lost here (a stand-in has
                # it): made anew, it would shift every later study.
                return out
            if made is not None:
                self._fill(out, made - self.next_study, lambda k: self._lost_study())
            self.studies[self.next_study] = record["study_name"]
            self.next_study += 1
        elif op == DELETE_STUDY:
            self.studies.pop(record["study_id"], None)
        elif op == CREATE_TRIAL and record["study_id"] in self.studies:
            study = record["study_id"]
            if made is not None and made > self.trials:
                # As many as its number shows were lost in its own study; the others in another,
                # most likely the last other to make a trial (searches of two studies side by side).
                number = record.get(NUMBER)
                here = number - self.counts.get(study, 0) if isinstance(number, int) else made - self.trials
                others = [s for s in self.recent if s != study] or [s for s in self.studies if s != study] or [study]
                self._fill(out, made - self.trials, lambda k: self._lost_trial(study if k < here else others[-1]))
            self._made_trial(study)
        if op in (CREATE_STUDY, CREATE_TRIAL):
            self.marked = made is not None
        return out + [record]

    def mark(self, log: dict[str, Any]) -> dict[str, Any]:
        """`log` to append, a creation with the id Optuna will give it; taken."""
        if log["op_code"] == CREATE_STUDY:
            known = [i for i, name in self.studies.items() if name == log["study_name"]]
            log = {**log, ID: known[0] if known else self.next_study}
        elif log["op_code"] == CREATE_TRIAL and log["study_id"] in self.studies:
            log = {**log, ID: self.trials, NUMBER: self.counts.get(log["study_id"], 0)}
        self.take(log)
        return log

    def _fill(self, out: list[dict[str, Any]], n: int, make) -> None:
        """`make(k)` the k-th of n stand-ins, when the damage so far can account for them."""
        if 0 < n <= self.slack:
            for k in range(n):
                record = make(k)
                if record is not None:
                    out.append(record)
                    self.slack -= 1

    def _made_trial(self, study: int) -> None:
        self.trials += 1
        self.counts[study] = self.counts.get(study, 0) + 1
        if study in self.recent:
            self.recent.remove(study)
        self.recent.append(study)

    def _lost_study(self) -> dict[str, Any]:
        name = self.studies[self.next_study] = f"lost study {self.next_study}"
        self.next_study += 1
        return _lost_study(name)

    def _lost_trial(self, study: int | None) -> dict[str, Any] | None:
        if study not in self.studies:
            return None  # Optuna would make none
        self._made_trial(study)
        return _lost_trial(study)


def _lost_study(name: str) -> dict[str, Any]:
    return {"op_code": CREATE_STUDY, "worker_id": "", "study_name": name, "directions": [1]}  # minimize


def _lost_trial(study: int) -> dict[str, Any]:
    # Failed, so that the lost trial's later records are refused rather than given to a trial of
    # unknown parameters; with a reason, as a failure without one is an interrupted search's,
    # which `tuner search` runs again.
    return {"op_code": CREATE_TRIAL, "worker_id": "", "study_id": study, "datetime_start": None,
            "state": 3, "user_attrs": {"reason": LOST_REASON}}  # TrialState.FAIL


def _lines(f: BinaryIO, place: _Place) -> Iterator[tuple[int, list[dict[str, Any]] | str]]:
    """From `place` on, each whole line's number and the records Optuna replays for it, or why
    it is damaged; `place` follows."""
    f.seek(place.offset)
    for raw in f:
        if not raw.endswith(b"\n"):
            return  # being written now, or left by a killed writer (the next append ends it)
        place.offset += len(raw)
        place.line += 1
        record, why = parse(raw)
        if record is None:
            place.slack += len(raw) // RECORD_BYTES + 1
            yield place.line, why
        else:
            yield place.line, place.take(record)


class JournalFile(BaseJournalBackend):
    """The journal in a file, one record a line (see the module's docstring)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.damaged: list[int] = []  # 1-based numbers of the lines skipped, as read so far
        self._read = _Place()  # after the last line read
        self._tail = _Place()  # after the last line an append saw
        self._scanned = 0  # lines read: damage up to there is known (a re-read from the start finds it again)
        self._lines: list[int] = []  # the line of each record the last read gave
        self._file: tuple[int, int] | None = None  # (device, inode) of the file read or appended to first

    def _same(self, f: BinaryIO, place: _Place) -> None:
        """Refuses a journal removed, replaced or cut short while this process used it: read from
        where it was, the new file gives no record (a search would wait for its trials' results
        until its deadline), and an append would give its creations ids the new file never made."""
        st = os.fstat(f.fileno())
        if self._file is None:
            self._file = (st.st_dev, st.st_ino)
        elif (st.st_dev, st.st_ino) != self._file or st.st_size < place.offset:
            raise self._gone()

    def _gone(self) -> TunerError:
        return TunerError(f"the journal {self.path} was removed, replaced or cut short while this process used it; "
                          "what was written to it since is lost, and every measurement is also in its study's log "
                          "beside it (studies/<study>.jsonl): `tuner search --import-records LOG` makes the study "
                          "again from it")

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        # Optuna asks for the records from the number it has replayed: from where the last read
        # ended, or, after a replay that stopped short (or a read that failed), from the start.
        if log_number_from < self._read.number:
            self._read = _Place()
        place = self._read
        logs, lines, found = [], [], []
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            if self._file is not None:  # read or appended to before
                raise self._gone() from None
            return []  # the first append makes it
        with f:
            self._same(f, place)
            for line, got in _lines(f, place):
                if isinstance(got, str):
                    if line > self._scanned:
                        found.append((line, got))
                    continue
                for record in got:
                    if place.number >= log_number_from:
                        logs.append(record)
                        lines.append(line)
                    place.number += 1
        self._lines = lines
        self._scanned = max(self._scanned, place.line)
        if found:
            note(self.damaged, str(self.path.resolve()), str(self.path), "line", found)
        return logs

    def refused(self, index: int, exc: Exception) -> None:
        """Optuna's replay refused the `index`th record of the last read."""
        line = self._lines[index]
        if line not in self.damaged:
            note(self.damaged, str(self.path.resolve()), str(self.path), "line", [(line, unreplayable(exc))])

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        try:
            f = open(self.path, "a+b")
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = open(self.path, "a+b")
        with f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                self._same(f, self._read if self._read.offset > self._tail.offset else self._tail)
                end = os.fstat(f.fileno()).st_size
                if end and os.pread(f.fileno(), 1, end - 1) != b"\n":
                    os.write(f.fileno(), b"\n")  # a killed writer's partial line: ours must not be glued to it
                # The ids the records get come from every line before them: read those not read yet.
                if self._read.offset > self._tail.offset:
                    self._tail = self._read.copy()
                for _ in _lines(f, self._tail):
                    pass
                ids = self._tail.copy()
                f.write("".join(json.dumps(ids.mark(log), separators=(",", ":")) + "\n" for log in logs).encode())
                f.flush()  # one write of whole lines, at the end (O_APPEND)
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


POSTGRES_SCHEME = "journal+postgresql://"


class _Storage(JournalStorage):
    """Optuna's JournalStorage, replaying one record at a time: a record its replay refuses (an
    intact line whose values were damaged: a date that is not one, a parameter without its
    distribution) is skipped with a warning, where Optuna's would raise on every read of the study.
    A creation refused is replaced by a stand-in, as the backend's, so that later ids stay
    those its writers saw. Its replay answers a call of this process's with an exception through
    its own record (a duplicate study, a finished trial): that one still reaches the caller."""

    def _sync_with_backend(self) -> None:
        replay = self._replay_result
        for i, record in enumerate(self._backend.read_logs(replay.log_number_read)):
            try:
                replay.apply_logs([record])
            except Exception as exc:
                if record.get("worker_id") == replay.worker_id:
                    raise
                self._backend.refused(i, exc)
                op = record["op_code"]
                if op in (CREATE_STUDY, CREATE_TRIAL):
                    replay.apply_logs([_lost_study(record["study_name"]) if op == CREATE_STUDY
                                       else _lost_trial(record["study_id"])])
                    replay.log_number_read -= 1  # in the place of the record refused


def storage(url: str | os.PathLike) -> JournalStorage:
    """Optuna's JournalStorage over a file (a path) or a PostgreSQL table (journal+postgresql://)."""
    url = str(url)
    if url.startswith(POSTGRES_SCHEME):
        from tuner.store.journal_postgres import JournalPostgres

        return _Storage(JournalPostgres("postgresql://" + url[len(POSTGRES_SCHEME):]))
    if "://" in url:
        from tuner.errors import TunerError

        raise TunerError(f"--storage {url}: a journal is a file's path or {POSTGRES_SCHEME}USER@HOST/DB")
    _refuse_other_files(Path(url))
    return _Storage(JournalFile(url))


def _refuse_other_files(path: Path) -> None:
    """A file none of whose whole lines is a journal record is some other file: refused, rather
    than read as a journal with every line damaged (and appended to by a search). A partial last
    line alone (the first append, cut by a kill) is no evidence either way."""
    try:
        with open(path, "rb") as f:
            lines = 0
            for raw in f:
                if parse(raw)[0] is not None or raw.lstrip(b"\0 \t\r\n").startswith(b'{"op_code"'):
                    return  # a record, or one cut short (a kill or a full disk mid-append)
                if not raw.endswith(b"\n"):
                    break
                lines += 1
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return  # no file yet (a search makes it), or a folder: opening it says what is wrong
    if lines:
        from tuner.errors import TunerError

        raise TunerError(f"--storage {path}: not a journal (none of its {lines:,} lines is a record of "
                         "Optuna's journal)")


def damaged_lines(storage) -> list[int]:
    """The 1-based numbers of the lines a journal file's storage skipped as damaged, as far as it
    has read (all of them once it has opened a study); [] for any other storage."""
    backend = getattr(storage, "_backend", None)  # JournalStorage's backend (private, as in Optuna 3 to 5)
    return list(backend.damaged) if isinstance(backend, JournalFile) else []
