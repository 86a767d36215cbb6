"""The compile queue: one per process and core count, first come first served, shared by every
build running at once (tuner.build.compile submits each translation unit's nvcc to it)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# A search compiles its next batch while its last one's units end: two builds at once, which
# share the cores here rather than each running as many compilers as there are (one ninja run a
# build did). On the H100 hosts the first searches' times did not change with it (the old
# pipeline already kept ~14 of 16 cores busy); what it keeps is the sharing and the kill.
_QUEUES: dict[int, concurrent.futures.ThreadPoolExecutor] = {}
_QUEUES_LOCK = threading.Lock()


def _forget_queues() -> None:
    """In a forked child: the parent's queues' threads are not there, so it makes its own."""
    global _QUEUES_LOCK
    _QUEUES.clear()
    _QUEUES_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_queues)


def queue_for(jobs: int) -> concurrent.futures.ThreadPoolExecutor:
    with _QUEUES_LOCK:
        if jobs not in _QUEUES:
            _QUEUES[jobs] = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="tuner-nvcc")
        return _QUEUES[jobs]


def shutdown() -> None:
    """Stop the queues' threads once their compilers have ended, as the interpreter's exit does
    (the command's own end, `tuner.cli.main._leave`, comes before it)."""
    with _QUEUES_LOCK:
        pools = list(_QUEUES.values())
        _QUEUES.clear()
    for pool in pools:
        pool.shutdown(wait=True)


# Each compiler in a process group of its own, so that a kill reaches cicc, ptxas and the host
# compiler under it; in this session where Python allows (3.11): a session is a scheduling group
# (Linux's autogroup), and a compiler in one of its own would take a share of the CPU beside the
# worker that times kernels, where in this one its `nice` leaves the worker first.
_OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


class Running:
    """A build's compilers underway, so that an interrupt ends them (each in a group of its own)."""

    def __init__(self):
        self.procs: set[subprocess.Popen] = set()
        self.stopped = False
        self.lock = threading.Lock()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            for proc in self.procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


def run_nvcc(cmd: list[str], log: Path, deadline: float, running: Running) -> tuple[float, str]:
    """One unit's nvcc, its output in `log`: (seconds, "" or why it failed)."""
    # At low priority: a search times kernels while its next batch compiles, and a timing
    # process starved of CPU launches late, so that the GPU idles inside the timed window.
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    started = time.monotonic()
    with open(log, "w") as out, running.lock:
        if running.stopped:
            return 0.0, "the build was stopped"
        proc = subprocess.Popen([*nice, *cmd], stdout=out, stderr=subprocess.STDOUT, **_OWN_GROUP)
        running.procs.add(proc)
    try:
        proc.wait(timeout=max(1.0, deadline - started))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return time.monotonic() - started, f"nvcc timed out (the build's {deadline - started:.0f} s left)"
    finally:
        with running.lock:
            running.procs.discard(proc)
    seconds = time.monotonic() - started
    return seconds, "" if proc.returncode == 0 else f"nvcc exited with {proc.returncode}"
