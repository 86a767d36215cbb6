"""The worker's child process (tuner.measure.worker starts it): the jobs it runs on its GPU
(verify then time a variant, re-time finalists, warm up, check) and the CUDA errors that end it."""

from __future__ import annotations

import os
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


CLOSE = 0.02  # finalists this near the best get an extra round of timing among themselves
# A finalists' re-timing: rounds of each in turn, its repetitions and GPU time a kind (a search on
# several GPUs gives each GPU its share of the repetitions: tuner.search.evaluate.LiveEvaluator.retime).
RETIME_TIMING = {"rounds": 20, "min_reps": 400, "budget_ms": 100.0}

class Child:
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
            self.families[name] = evaluation(name)
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
            result[k] = r.take_until(graph=graph, **cfg).as_dict()
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
        cfg = {**RETIME_TIMING, **job.get("timing", {})}
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


def main(conn, device_index: int, log_path: str | None = None) -> None:
    if log_path:  # kernels' printf and device-side assert reports go to the log, not the terminal
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    from tuner import paths

    paths.keep_bytecode()  # before torch's import, the most of a child's start
    from tuner.measure import timing
    try:
        child = Child(device_index)
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


def evaluation(name: str):
    """A family's `Evaluation`: its own (evaluate.py), or the one its op's declaration gives
    (tuner/measure/declared.py)."""
    from tuner import families
    from tuner.measure import declared

    own = getattr(families.get(name), "OP_DECLARATION", None) is None or families.has_part(name, "evaluate")
    return families.part(name, "evaluate").Evaluation() if own else declared.Evaluation(name)
