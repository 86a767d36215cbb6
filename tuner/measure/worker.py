"""Run variants in a child process: verify, then time; survive crashes and hangs.

A kernel that reads out of bounds or hits a device-side assert leaves its CUDA
context unusable, and one that never finishes blocks its process. So kernels
run in a child; the parent waits with a timeout, and a crash (EOF on the pipe),
a hang (no answer in time) or a CUDA error (the child reports it and exits)
becomes a failed result, after which a fresh child is started for the next job.
A child killed from outside (SIGKILL, SIGTERM: a user, the OOM killer) did not die
of its variant: the variant is evaluated once more on a fresh child.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import signal

from tuner.measure.child import main as child_main

class WorkerError(RuntimeError):
    """The child could not start at all (our problem, not a variant's)."""


# How a child ends when it is killed from outside; kernels that crash the process end it otherwise
# (SIGSEGV, SIGABRT), and CUDA errors are reported by the child before it exits.
KILLED = (-signal.SIGKILL, -signal.SIGTERM)


class Worker:
    """A child process that evaluates jobs one at a time; restarted after a crash or hang.
    `target` is the child's main function (tests give a fake one)."""

    def __init__(self, device_index: int = 0, timeout: float = 60.0, start_timeout: float = 600.0,
                 log_path: str | None = None, target=None, warm: dict | None = None):
        self.device_index = device_index
        self.warm = warm  # a job each child runs first, unasked (Child.warm): its reply is read before the first job's
        self.log_path = log_path
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.target = target or child_main
        self.restarts = 0
        self.killed = 0  # children killed from outside; their jobs were run again
        self._proc = None
        self._conn = None
        self.graphs = True  # time from CUDA graphs; off once a capture failed in a child (timing.spoiled)
        self._greeted = False
        self._warming = False  # its warm-up's reply is still to be read
        self.hello: dict = {}  # the running child's: its pid and its GPU's description

    def spawn(self) -> None:
        """Start the child without waiting for it: it imports torch and starts CUDA (seconds)
        while the first variants compile. One started by `spawn_ahead` with the same settings
        is taken over."""
        ahead = _AHEAD.pop(self._settings(), None)
        if ahead is not None and ahead[0].is_alive():
            self._proc, self._conn = ahead
            self._greeted = False
            self._warming = self.warm is not None  # its warm-up was sent when it started
            return
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=self.target, args=(child, self.device_index, self.log_path),
                                 daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        self._greeted = False
        self._warming = self.warm is not None
        if self._warming:
            parent.send(self.warm)

    def _settings(self) -> tuple:
        return (self.device_index, self.log_path, self.target, json.dumps(self.warm, sort_keys=True))

    def _start(self) -> None:
        self.spawn()
        self._greet()

    def _warmed(self) -> None:
        """Read the warm-up's reply. A warm-up that failed is no variant's failure: a child it
        left dead is started again, and its first job does the same work and says what failed."""
        if not self._warming:
            return
        self._warming = False
        try:
            reply = self._conn.recv() if self._conn.poll(2 * self.timeout) else {"fatal": True}
        except EOFError:
            reply = {"fatal": True}
        if reply.get("fatal"):
            self.close()
            warm, self.warm = self.warm, None
            try:
                self._start()
            finally:
                self.warm = warm

    def _greet(self) -> None:
        parent = self._conn
        if not parent.poll(self.start_timeout):
            self.close()
            raise WorkerError(f"the worker did not start within {self.start_timeout:.0f} s")
        try:
            hello = parent.recv()
        except EOFError as exc:
            raise WorkerError(f"the worker died while starting (exit code {self._proc.exitcode})") from exc
        if not hello.get("ready"):
            self.close()
            raise WorkerError(f"the worker failed to start:\n{hello.get('message', '')}")
        self.hello = hello
        self._greeted = True

    def ready(self) -> dict:
        """The child's hello, once it has started and run its warm-up (waited for here, or started
        here, when need be)."""
        if self._proc is not None and not self._greeted:
            self._greet()
        elif self._proc is None or not self._proc.is_alive():
            self._start()
        self._warmed()
        return self.hello

    def evaluate(self, job: dict, on_probe=None) -> dict:
        """The job's result; a probe the child sends on the way is answered by `on_probe(probe)`
        (True: go on), or with True when there is none. A child killed from outside is
        replaced and the job run again, once."""
        result = self._evaluate(job, on_probe)
        if result.get("killed"):
            self.killed += 1
            result = self._evaluate(job, on_probe)
            if result.get("killed"):
                result["message"] += "; twice for this variant"
        result.pop("killed", None)
        return result

    def _evaluate(self, job: dict, on_probe=None) -> dict:
        self.ready()  # spawned ahead, its start-up overlapped the compiles; or started here
        self._conn.send(job if self.graphs else {**job, "graph": False})
        while True:
            if not self._conn.poll(self.timeout):
                self.close()
                self.restarts += 1
                return {"status": "fail", "reason": "hang", "message": f"no answer within {self.timeout:.0f} s"}
            try:
                result = self._conn.recv()
            except EOFError:
                self._proc.join(5)
                code = self._proc.exitcode
                self.close()
                self.restarts += 1
                if code in KILLED:
                    return {"status": "fail", "reason": "crash", "killed": True,
                            "message": f"the worker was killed from outside ({signal.Signals(-code).name})"}
                return {"status": "fail", "reason": "crash", "message": f"the worker died (exit code {code})"}
            if "probe" not in result:
                break
            self._conn.send(bool(on_probe(result["probe"])) if on_probe else True)
        if result.get("fatal"):
            self.close()
            self.restarts += 1
        elif result.pop("restart", False):  # a failed graph capture: replaced, and no graphs from now on
            self._proc.join(10)
            self.close()
            self.restarts += 1
            self.graphs = False
        return result

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Children started before the Worker that takes them over: its settings -> (process, pipe).
_AHEAD: dict[tuple, tuple] = {}


def spawn_ahead(device_index: int = 0, log_path: str | None = None, warm: dict | None = None, target=None) -> None:
    """Start the child that a Worker made later with these settings takes over: `tuner search`
    starts its GPU's worker before it imports Optuna and reads the study, so that torch's import
    and CUDA's start (seconds) begin sooner. One never taken over ends with this process."""
    w = Worker(device_index, log_path=log_path, warm=warm, target=target)
    w.spawn()
    _AHEAD[w._settings()] = (w._proc, w._conn)


def discard_ahead() -> None:
    """End the children started ahead that no Worker took over (the search had nothing to run)."""
    while _AHEAD:
        proc, conn = _AHEAD.popitem()[1]
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        conn.close()


def warm_job(problem, objective: str) -> dict:
    """The warm-up a search's worker runs first (Child.warm) for a family's Problem."""
    return {"kind": "warm", "family": problem.family, "problem": problem.__dict__, "objective": objective}
