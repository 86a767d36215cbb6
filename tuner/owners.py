"""Who a process is, as searchers and exports tag what they leave: its host, pid and start time
(tuner.store.searchers, a searcher's trials; tuner.paths.staged, an export's staging folder), and
whether the process a tag names is known to be gone."""

from __future__ import annotations

import os
import socket


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a process (tells a live pid from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def host() -> str:
    """The name this process gives its host: TUNER_HOST, or the hostname (containers on one
    machine may share a hostname but not their processes: give each its own TUNER_HOST)."""
    return os.environ.get("TUNER_HOST") or socket.gethostname()


def owner() -> str:
    """This process's tag: "host/pid/start time"."""
    pid = os.getpid()
    return f"{host()}/{pid}/{_start_time(pid)}"


def owner_alive(tag: str) -> bool:
    """False only when the process a tag names is known to be gone (same host, and its pid gone or
    taken by a process started later)."""
    try:
        where, pid, start = tag.rsplit("/", 2)
    except ValueError:
        return False
    if where != host():
        return True  # cannot tell from here: the heartbeats tell
    return _start_time(int(pid)) == start
