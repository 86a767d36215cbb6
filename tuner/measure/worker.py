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
import os
import signal
import time
import traceback
from typing import Any

# Substrings of CUDA errors, most specific first, and the reason they become.
# PyTorch appends advice about device-side assertions to every CUDA error, so the
# assert is matched by its own error text only.
_CUDA_REASONS = (
    ("device-side assert triggered", "device-side assert"),
    ("cudaerrorassert", "device-side assert"),
    ("illegal memory access", "illegal address"),
    ("misaligned address", "illegal address"),
    ("illegal address", "illegal address"),
    ("too many resources", "launch error"),
    ("invalid configuration", "launch error"),
    ("invalid argument", "launch error"),
    ("launch failed", "launch error"),
    ("launch failure", "launch error"),
    # the harness's memory (inputs, float64 answers) or the variant's: a fresh child starts empty
    ("out of memory", "out of memory"),
    ("cuda error", "cuda error"),
    ("accelerator error", "cuda error"),
)


def classify(message: str) -> str | None:
    low = message.lower()
    for needle, reason in _CUDA_REASONS:
        if needle in low:
            return reason
    return None


# ------------------------------------------------------------------- child

CLOSE = 0.02  # finalists this near the best get an extra round of timing among themselves

class _Child:
    """State kept across jobs in the child: each family's evaluation hooks, the L2 flush buffer."""

    def __init__(self, device_index: int):
        import torch

        from tuner import gpus
        from tuner.measure import timing

        torch.cuda.set_device(device_index)
        # The parent reads it from the hello (the driver's version from its own nvidia-smi query).
        self.gpu = gpus.attached(device_index).describe(driver="")
        self.flush = timing.L2Flush()
        self.families: dict[str, Any] = {}

    def family(self, name: str):
        """The family's `Evaluation` (load, check, calls, errors), made once per process: its own
        (evaluate.py), or the one its op's declaration gives (tuner/measure/declared.py)."""
        if name not in self.families:
            from tuner import families
            from tuner.measure import declared

            own = getattr(families.get(name), "OP_DECLARATION", None) is None or families.has_part(name, "evaluate")
            self.families[name] = families.part(name, "evaluate").Evaluation() if own else declared.Evaluation(name)
        return self.families[name]

    def run(self, job: dict, ask=None) -> dict:
        """Verify, then time. With `job["probe"]`, a few repetitions are timed first and
        `ask({"probe": ...})` says whether to go on (False: the variant is pruned)."""
        from tuner.measure import timing

        family = self.family(job["family"])
        result: dict[str, Any] = {"status": "fail"}
        started = time.monotonic()
        kernel = family.load(job["so"], job["name"], job.get("entry"))
        verdict = family.check(kernel, job["problem"])
        errors = {k: v for k, v in verdict.items() if k not in ("ok", "reason", "message")}
        if not verdict["ok"]:
            return {**result, "reason": verdict["reason"], "message": verdict["message"], **errors,
                    "verify_s": time.monotonic() - started}
        result.update(errors, verify_s=time.monotonic() - started)

        started = time.monotonic()
        fwd_fn, bwd_fn = family.calls(kernel, job["problem"], job["objective"])
        calls = {"fwd": fwd_fn, "bwd": bwd_fn} if bwd_fn is not None else {"fwd": fwd_fn}
        graph = job.get("graph", True)
        reps = {k: timing.Repetitions(fn, flush=self.flush) for k, fn in calls.items()}
        if job.get("probe") and ask is not None:  # its repetitions count in the timing that follows
            probe = {k: r.take(job["probe"], graph=graph).as_dict() for k, r in reps.items()}
            if not ask({"probe": probe}):
                if family.errors(kernel):
                    return {**result, "reason": "wrong result", "message": "validation flagged valid inputs"}
                return {**result, **probe, "status": "pruned", "time_s": time.monotonic() - started}
        cfg = job.get("timing", {})
        for k, r in reps.items():
            result[k] = r.take(r.count(**cfg) - len(r.samples), graph=graph).as_dict()
        flagged = family.errors(kernel)  # generated inputs are valid: a flag here is a kernel bug
        if flagged:
            return {**result, "reason": "wrong result", "message": f"validation flagged valid inputs ({flagged})"}
        result["time_s"] = time.monotonic() - started
        result["status"] = "ok"
        return result

    def check(self, job: dict) -> dict:
        """A finalist checked in full (tuner.search.finalists): at the problem's own sizes, where the
        search checked at smaller ones, and built `whole`, at every word of its kind
        (`Evaluation.check(..., whole, full=True)`)."""
        family = self.family(job["family"])
        verdict = family.check(family.load(job["so"], job["name"], job.get("entry")), job["problem"],
                               whole=job.get("whole", True), full=True)
        return {"status": "ok" if verdict["ok"] else "fail", "reason": verdict["reason"], "message": verdict["message"]}

    def warm(self, job: dict) -> dict:
        """What the first variant's check and timing would make first (the family's state, its
        input sets and answers, the timing inputs), made while the first variants compile."""
        family = self.family(job["family"])
        if hasattr(family, "warm"):
            family.warm(job["problem"])
        return {"status": "ok"}

    def retime(self, job: dict) -> dict:
        """The finalists timed in turns, with more repetitions than in the search; those within
        CLOSE of the best are timed in turns once more among themselves (their samples pooled),
        so that which of two near-equal kernels wins is not decided by one round's drift."""
        from tuner.measure import timing
        from tuner.store.records import BASELINE, BASELINE_EXTRA, objective_value

        family = self.family(job["family"])
        calls: dict[str, dict] = {"fwd": {}, "bwd": {}}
        kernels = [(k["name"], lambda k=k: family.calls(family.load(k["so"], k["name"], k.get("entry")), job["problem"],
                                                        job["objective"])) for k in job["kernels"]]
        baseline = family.baseline(job["problem"], job["objective"]) if job.get("baseline") and hasattr(
            family, "baseline") else None
        if baseline is not None:
            # the torch op the family replaces, timed in the same turns: the export serves it where
            # it wins; a third call is what the op pays beside a variant's timed backward
            # (records.served_by adds it to the variant's)
            kernels.append((BASELINE, lambda: baseline[:2]))
            if len(baseline) > 2:
                calls["bwd"][BASELINE_EXTRA] = baseline[2]
        for name, make in kernels:
            f, b = make()
            calls["fwd"][name] = f
            if b is not None:
                calls["bwd"][name] = b
        cfg = {"rounds": 20, "min_reps": 400, "budget_ms": 100.0, **job.get("timing", {})}
        samples: dict[str, dict[str, list[float]]] = {"fwd": {}, "bwd": {}}
        out: dict[str, dict] = {}
        names = list(calls["fwd"])
        beside = [BASELINE_EXTRA] if BASELINE_EXTRA in calls["bwd"] else []  # timed in the first round alone
        for extra in (False, True):
            for kind, fns in calls.items():
                timed = {n: fns[n] for n in names + ([] if extra else beside) if n in fns}
                for name, t in timing.interleaved(timed, flush=self.flush, samples=samples[kind], **cfg).items():
                    out.setdefault(name, {})[kind] = t.as_dict()
            # the close variants get a second round; the baseline is timed once, beside them
            value = {n: objective_value(out[n], job["objective"]) for n in names if n != BASELINE}
            best = min(value.values())
            names = [n for n in names if n in value and value[n] <= best * (1 + CLOSE)]
            if extra or len(names) < 2:
                break
            for n in names:
                out[n]["extra_round"] = True
        return {"status": "ok", "timings": out}


def _child_main(conn, device_index: int, log_path: str | None = None) -> None:
    if log_path:  # kernels' printf and device-side assert reports go to the log, not the terminal
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    from tuner import paths

    paths.keep_bytecode()  # before torch's import, the most of a child's start
    from tuner.measure import timing
    try:
        child = _Child(device_index)
    except Exception:  # noqa: BLE001 - report any start-up failure to the parent
        conn.send({"ready": False, "message": traceback.format_exc()})
        return
    conn.send({"ready": True, "pid": os.getpid(), "gpu": child.gpu})
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        def ask(message):
            conn.send(message)
            return conn.recv()

        try:
            kind = job.get("kind")
            own = {"retime": child.retime, "warm": child.warm, "check": child.check}.get(kind)
            result = own(job) if own else child.run(job, ask)
            if timing.spoiled():  # its allocator thinks a capture is under way: a fresh child next
                result["restart"] = True
            conn.send(result)
            if result.get("restart"):
                return
        except Exception as exc:  # noqa: BLE001 - every failure of a variant is data
            message = f"{type(exc).__name__}: {exc}"
            reason = classify(message)
            if reason is None:
                conn.send({"status": "fail", "reason": "error", "message": traceback.format_exc()[-2000:]})
                continue
            # A CUDA error poisons this process's context: report it and exit.
            conn.send({"status": "fail", "reason": reason, "message": message[:2000], "fatal": True})
            return


# ------------------------------------------------------------------ parent

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
        self.target = target or _child_main
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
