"""How the `tuner` command ends: through os._exit once its exit handlers ran; on SIGTERM as on Ctrl-C."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading


def leave(code: int) -> int:
    """The command's end without the interpreter's teardown: freeing a search's modules (Optuna,
    SQLAlchemy, pandas, torch: 960-1,760) one by one took 0.3-0.4 s on the CI machine and ~1 s on the
    GPU hosts after the last line, memory the system frees at once. The exit handlers still run
    (logging's flush, the searcher's lock file, multiprocessing's children) and every writer of the
    project closed its files; a thread still running (not a daemon) gets the interpreter's own
    exit, which waits for it."""
    if "tuner.build.queue" in sys.modules:  # its idle threads would keep the interpreter's exit
        sys.modules["tuner.build.queue"].shutdown()
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        return code
    atexit._run_exitfuncs()  # what the interpreter's exit would run first
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(int(code or 0))


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch job's time limit, `kill`), raised where Ctrl-C's KeyboardInterrupt would be,
    so that a command ends as Ctrl-C ends it: its cleanup runs (a search's workers and compiles
    stopped, its measurements told) and it says so, where SIGTERM's default ended it mid-step, silently."""


def terminated(signum, frame):
    raise Terminated()
