"""Who is searching: each searcher's owner tag (host, pid, start time) and its registration on
this host, by which the others tell it is gone (its heartbeat in a shared study:
tuner/search/heartbeat.py)."""

from __future__ import annotations

import atexit
import os
import re
import socket

from tuner import paths

def _start_time(pid: int) -> str | None:
    """The kernel's start time of a process (tells a live pid from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def host() -> str:
    """The name this searcher gives its host: TUNER_HOST, or the hostname (containers on one
    machine may share a hostname but not their processes: give each its own TUNER_HOST)."""
    return os.environ.get("TUNER_HOST") or socket.gethostname()


def owner() -> str:
    pid = os.getpid()
    return f"{host()}/{pid}/{_start_time(pid)}"


def owner_alive(tag: str) -> bool:
    """False only when the process that ran a trial is known to be gone (same host)."""
    try:
        where, pid, start = tag.rsplit("/", 2)
    except ValueError:
        return False
    if where != host():
        return True  # cannot tell from here: the heartbeats tell
    return _start_time(int(pid)) == start


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
