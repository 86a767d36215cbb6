"""Optuna storage and studies: names, owners of running trials, duplicates, result tables."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import paths
from tuner.store.searchers import others_alive, owner, owner_alive
from tuner.errors import TunerError

JOURNAL_NAME = "tuner.journal"
DB_NAME = "tuner.db"  # the default before the journal: still used where it is the only one


def storage_url(url: str | None = None) -> str:
    """`url` (an RDB URL, or a journal file's path), or the default: studies/tuner.journal. A local
    storage that is there but not a regular file (a folder, a device, a pipe) is refused: read as a
    journal, /dev/zero fills the memory and a pipe waits for ever."""
    if url:
        path = local_path(url)
        if path and Path(path).exists() and not Path(path).is_file():
            what = "a folder" if Path(path).is_dir() else "not a regular file (a device or a pipe)"
            raise TunerError(f"storage {url}: {what}; a journal or an SQLite database is a file")
        return url
    folder = paths.studies_dir()  # made by the first search that writes there, not by reading
    if (folder / DB_NAME).exists() and not (folder / JOURNAL_NAME).exists():
        return f"sqlite:///{folder / DB_NAME}"
    return str(folder / JOURNAL_NAME)


def is_journal(url: str) -> bool:
    return "://" not in url or url.startswith("journal+")


def shown(url: str) -> str:
    """A storage URL fit to print: its password hidden."""
    return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


def local_path(url: str) -> str | None:
    """The file a storage URL names on this machine (a journal's path, an SQLite database's), or
    None (a server's; an in-memory database)."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):].split("?")[0]
        return None if path in ("", ":memory:") else path
    return None if "://" in url else url


def absent(url: str) -> bool:
    """A journal file or SQLite database that does not exist yet: it holds no study, and reading it
    must not create it."""
    path = local_path(url)
    return path is not None and not Path(path).exists()


def records_path(name: str):
    """The measurement log of a study (what `--simulate` replays), in studies/: a study's name is a
    name (one read from a shared storage too), never a path that leads elsewhere."""
    return paths.studies_dir() / f"{plain_name(name)}.jsonl"


def plain_name(name: str) -> str:
    """`name` where it can name a file in a folder: no separator, no leading dot, no control
    character; else a TunerError."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or any(ord(c) < 32 or ord(c) == 127
                                                                              for c in name):
        raise TunerError(f"study name {name!r} cannot name a file: no '/' or '\\', no leading '.', no control "
                         "characters")
    return name


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    # WAL lets readers work beside a writer, and synchronous=NORMAL fsyncs at checkpoints
    # rather than at every commit: a killed process still loses nothing committed (only
    # a power cut could), and a trial costs a few ms of bookkeeping instead of ~100.
    if type(dbapi_connection).__module__.startswith("sqlite3"):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()


def storage(url: str | None = None):
    """An Optuna storage for `url`; a storage object is used as it is (an in-memory one for
    simulated runs that need no file)."""
    import optuna
    import sqlalchemy

    if isinstance(url, optuna.storages.BaseStorage):
        return url
    url = storage_url(url)
    try:
        return _open(url)
    except ImportError as exc:
        raise TunerError(f"storage {shown(url)}: {exc}; for PostgreSQL, install psycopg with the project's extra: "
                         "python -m pip install -e '.[postgres]' in the tuner checkout") from exc
    except (OSError, sqlalchemy.exc.SQLAlchemyError) as exc:
        raise TunerError(f"storage {shown(url)}: {_why(url, exc)}") from exc
    except Exception as exc:
        # what a journal holds is replayed as it opens: a damaged file fails there, in Optuna's
        # replay or our reader; psycopg's errors are a server that cannot be reached or used
        if type(exc).__module__.split(".")[0] == "psycopg":
            raise TunerError(f"storage {shown(url)}: {_why(url, exc)}") from exc
        if isinstance(exc, (ValueError, KeyError, TypeError, AttributeError)) and "://" not in url:
            raise TunerError(f"storage {url}: not a journal Optuna can read ({type(exc).__name__}: "
                             f"{_first_line(exc)})") from exc
        raise


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _why(url: str, exc: Exception) -> str:
    """Why a storage would not open, in one line."""
    import sqlalchemy

    if isinstance(exc, sqlalchemy.exc.NoSuchModuleError):
        return (f"unknown scheme {url.split('://')[0]!r}; a storage is a journal file's path, "
                "journal+postgresql://USER@HOST/DB, or an Optuna RDB URL such as sqlite:///FILE or "
                "postgresql+psycopg://USER@HOST/DB")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"cannot open it: {_first_line(getattr(exc, 'orig', None) or exc)}"


def _open(url: str):
    import optuna
    import sqlalchemy

    if is_journal(url):
        from tuner.store import journal

        if "://" not in url and Path(url).is_dir():
            raise TunerError(f"storage {url}: a folder; a journal is a file, such as {Path(url) / JOURNAL_NAME}")
        return journal.storage(url)  # the file and its folder are made by the first write
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # Several `tuner search` processes share one file: wait for its lock, do not fail.
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120}}
        if not sqlalchemy.event.contains(sqlalchemy.engine.Engine, "connect", _sqlite_pragmas):
            sqlalchemy.event.listen(sqlalchemy.engine.Engine, "connect", _sqlite_pragmas)
    if url.startswith("sqlite"):
        # Two processes creating the same new file race on its schema: take turns.
        with _file_lock(url.split(":///", 1)[-1] + ".lock"):
            return optuna.storages.RDBStorage(url, **kwargs)
    import time

    for attempt in range(6):
        try:
            return optuna.storages.RDBStorage(url, **kwargs)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # Searchers started together on a new database race to create its tables; the
            # loser finds them made on the next try.
            if attempt == 5:
                raise
            time.sleep(0.5 * (attempt + 1))


def fail(study, st, t, message: str) -> bool:
    """Fail a running trial as interrupted and queue its variant again; False when it finished
    first (its searcher was alive after all, or another searcher failed it)."""
    import optuna
    from optuna.trial import TrialState

    try:
        # Attributes first: a finished trial takes none. (A searcher that was alive after all may
        # finish the trial in between; it keeps its result, with this reason beside it.)
        st.set_trial_user_attr(t._trial_id, "reason", "interrupted")
        st.set_trial_user_attr(t._trial_id, "message", message)
        if not st.set_trial_state_values(t._trial_id, TrialState.FAIL):
            return False
    except optuna.exceptions.UpdateFinishedTrialError:
        # Its searcher finished it first. If that was as a failure, the reason written above now
        # marks it interrupted, and the searcher drops it (`_tell`): queue it, as no one else will.
        now = st.get_trial(t._trial_id)
        if interrupted(now) and t.number not in retried(study):
            _requeue(study, now)
        return False
    _requeue(study, t)
    return True


@contextlib.contextmanager
def _file_lock(path: str):
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def create(name: str, st, sampler, pruner=None):
    """Create or load a study; serialised like the storage, for the same reason."""
    import optuna

    url = str(st.engine.url) if hasattr(st, "engine") else ""
    lock = _file_lock(url.split(":///", 1)[-1] + ".lock") if url.startswith("sqlite") else contextlib.nullcontext()
    with lock:
        return optuna.create_study(study_name=name, storage=st, direction="minimize", sampler=sampler,
                                   pruner=pruner, load_if_exists=True)


def study_name(family: str, gpu: str, problem_key: str, objective: str) -> str:
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-")
    return f"{family}-{gpu}-{problem_key}-{objective}"


def load(name: str, url: str | None = None):
    import optuna

    url = storage_url(url)
    if absent(url):
        raise TunerError(f"no study {name!r} in {shown(url)}: no such file (a search makes it)")
    st = storage(url)
    try:
        return optuna.load_study(study_name=name, storage=st)
    except KeyError as exc:
        known = [s.study_name for s in optuna.get_all_study_summaries(st)]
        raise TunerError(f"no study {name!r} in {shown(url)}; studies there: {', '.join(known) or 'none'}") from exc


def summaries(url: str | None = None):
    """The studies of a storage (none where its file does not exist: reading creates nothing)."""
    import optuna

    url = storage_url(url)
    return [] if absent(url) else optuna.get_all_study_summaries(storage(url))


def names_on(family: str, gpu_label: str, url: str | None = None) -> list[str]:
    """The studies of a family on one GPU (all its problems and shape buckets), by name."""
    prefix = f"{family}-{gpu_label}-"
    return sorted(s.study_name for s in summaries(url) if s.study_name.startswith(prefix))


def fail_interrupted(study, st) -> list[Any]:
    """Mark trials left RUNNING by a killed `tuner search` as failed and queue their params again.

    A trial's owner is recorded just after Optuna creates it, so a kill in between leaves
    a RUNNING trial with no owner: such trials are orphans when no other searcher of this
    TUNER_HOME is alive (an alive one may be between those two steps).
    """
    from optuna.trial import TrialState

    requeued = []
    others = None
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tag = t.user_attrs.get("owner")
        if tag is None:
            others = others_alive() if others is None else others
            if others:
                continue
            tag = "unknown (killed before it recorded itself)"
        elif owner_alive(tag):
            continue
        if fail(study, st, t, f"the process that ran it ({tag}) is gone"):
            requeued.append(t.number)
    # A searcher killed between failing an orphan and queueing its retry left it without one.
    queued_again = retried(study)
    for t in study.get_trials(deepcopy=False):
        if interrupted(t) and t.number not in queued_again and t.number not in requeued:
            _requeue(study, t)
            requeued.append(t.number)
    return requeued


def retried(study) -> set[int]:
    """Numbers of the trials queued again (each retry names the trial it repeats)."""
    return {t.user_attrs["retry_of"] for t in study.get_trials(deepcopy=False) if "retry_of" in t.user_attrs}


def _requeue(study, t) -> None:
    study.enqueue_trial(t.params, user_attrs={"retry_of": t.number, "owner": owner(),
                                              **({"fault": t.user_attrs["fault"]} if "fault" in t.user_attrs else {})},
                        skip_if_exists=False)


def finished_count(study) -> int:
    """Trials that count towards --trials: complete, pruned or failed, except interruptions (re-run)."""
    return tally(study).done


@dataclass
class Tally:
    done: int  # trials that count towards --trials
    running: set[int]  # numbers of the running trials (any searcher's)
    waiting: int  # queued trials (retries, planted faults): the next asks take them


def tally(study) -> Tally:
    """Where the study stands, in one read."""
    trials = study.get_trials(deepcopy=False)
    return Tally(done=sum(1 for t in trials if t.state.name in ("COMPLETE", "PRUNED", "FAIL") and not interrupted(t)),
                 running={t.number for t in trials if t.state.name == "RUNNING"},
                 waiting=sum(1 for t in trials if t.state.name == "WAITING"))


def claim(study, params: dict, distributions: dict, user_attrs: dict):
    """A new RUNNING trial with its parameters and attributes, written at once: one write to the
    storage where `study.ask` makes one per parameter and per attribute, and no read of the
    study's unfinished trials (`ask` reads them all, looking for a queued one).

    Study's storage and id are private attributes, stable since Optuna 3; `Trial(study, id)` is
    the object `ask` returns."""
    import optuna

    frozen = optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, params=params,
                                       distributions=distributions, user_attrs=user_attrs)
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=frozen)
    return optuna.trial.Trial(study, trial_id)


def facts(t) -> dict:
    """A trial's user attributes with its packed `result` spread out (studies written before the
    result was packed have the same keys at the top level)."""
    a = t.user_attrs
    return {**a, **a["result"]} if isinstance(a.get("result"), dict) else dict(a)


def interrupted(t) -> bool:
    """Failed because its searcher died, not by its variant (marked so by `fail`; a FAIL without a
    reason is counted the same: a searcher tells every failure of a variant with one)."""
    return t.state.name == "FAIL" and t.user_attrs.get("reason") in (None, "interrupted")


def family_of(st):
    """The kernel family a study was made for (`tuner search` records it)."""
    from tuner import families

    name = st.user_attrs.get("family")
    if not name:
        raise TunerError(f"study {st.study_name!r} was not made by `tuner search` (no family recorded)")
    return families.get(name)
