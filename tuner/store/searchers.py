"""Who is searching: each searcher's owner tag (host, pid, start time) and its registration on
this host, by which the others tell it is gone (its heartbeat in a shared study:
tuner/search/heartbeat.py)."""

from __future__ import annotations

import atexit
import re

from tuner import paths
from tuner.owners import host, owner, owner_alive  # noqa: F401 (a searcher's tag, and whether it lives)


_registration = None  # this process's lock file under studies/.owners, held while it lives


def register() -> None:
    """Announce this process as a live searcher: a file it holds locked until it exits."""
    import fcntl

    global _registration
    if _registration is not None:
        return
    folder = paths.studies_dir() / ".owners"
    folder.mkdir(parents=True, exist_ok=True)
    f = open(folder / re.sub(r"[^A-Za-z0-9.-]", "_", owner()), "w")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _registration = f
    atexit.register(f.close)


def others_alive() -> bool:
    """Is another `tuner search` of this TUNER_HOME alive on this host? Stale files are removed."""
    import fcntl

    folder = paths.studies_dir() / ".owners"
    mine = _registration.name if _registration is not None else None
    alive = False
    for path in folder.glob("*") if folder.exists() else []:
        if str(path) == mine:
            continue
        with open(path, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                alive = True
                continue
        path.unlink(missing_ok=True)
    return alive
