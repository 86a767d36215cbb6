"""Where a search gets its measurements: the GPU (live) or a recorded file (simulated).

Both give the search the same shapes of data: `prepare` turns variants into build
results (compiled or not), `evaluate` turns one into a verified measurement or a
failure with a reason, and `retime` times the best few again, interleaved.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuner import families, gpus
from tuner.build import compile as build
from tuner.store import records
from tuner.store import searchers
from tuner.search.pruning import PROBE_REPS
from tuner.errors import GpuError, TunerError
from tuner.variant import Variant


# Repetitions of a variant in the search: 16 (one captured chunk), then a chunk at a time until the
# median is known within ±1% (its 95% confidence interval, `timing.median_known`), at most 192 or
# about 4 ms of measured time a call, each behind an L2 flush (~19 µs on an H100). The search only
# ranks variants (the finalists are timed again with more, `Evaluator.retime`), and a tie within 1%
# is settled there: a steady kernel (EmbeddingBag's 0.4 ms backward, RMSNorm's bandwidth-bound
# rows) stops at 16, where 32 were most of its search's GPU time; an 8 µs GIoU kernel whose
# repetitions spread by 5% takes ~96 where it took 192. Replayed from a captured graph
# (`timing.Repetitions`, the probe's repetitions among them).
SEARCH_TIMING = {"min_reps": 16, "max_reps": 192, "budget_ms": 4.0, "precision": 0.01}


_POOL = {"median_us": lambda xs: sum(xs) / len(xs), "spread_us": max, "min_us": min, "reps": sum, "graphed": all}


def pooled(timings: list[dict[str, dict]]) -> dict[str, dict]:
    """Re-timings of the same finalists on several GPUs of one model (name -> {"fwd": a Timing's
    dict, "bwd": ...}, one mapping a GPU; a GPU whose worker failed gives none) as one: each
    median the mean of the GPUs' medians, each spread the widest, each minimum the least, the
    repetitions added; a finalist timed twice on any GPU was (`extra_round`). A finalist or kind
    only some GPUs timed keeps theirs."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(n for t in timings for n in t):
        each = [t[name] for t in timings if name in t]
        merged: dict = {}
        for kind in dict.fromkeys(k for e in each for k in e if isinstance(e[k], dict)):
            parts = [e[kind] for e in each if isinstance(e.get(kind), dict)]
            merged[kind] = {**parts[0], **{key: how([p[key] for p in parts]) for key, how in _POOL.items()
                                           if all(key in p for p in parts)}}
        if any(e.get("extra_round") for e in each):
            merged["extra_round"] = True
        out[name] = merged
    return out


def _build_result(b: build.Build) -> dict:
    result = {
        "status": "ok" if b.ok else "fail", "compile_s": b.compile_s, "compiled": not b.cached,
        "regs_fwd": b.regs("forward"), "regs_bwd": b.regs("backward"),
        "spill_bytes": b.spill_bytes, "so": str(b.so) if b.so else None, "entry": b.entry,
    }
    if not b.ok:
        result.update(reason="compile error", message=b.error)
    return result


class Evaluator:
    gpu_label: str
    gpu_name: str | None  # known before the GPU is started, where it can be (None: known from gpu_info)
    gpu_info: dict
    batch_size: int
    restarts: int = 0
    killed: int = 0  # workers killed from outside (their variant was evaluated again)
    parallel: int = 1  # variants it evaluates at once (one per GPU), each in its own slot

    def prepare(self, variants: list[Variant], whole: bool = False, on_ready=None) -> dict[str, dict]:
        """Build results by variant name: of what the problem runs (a family's `search_focus`),
        or with `whole` of every kernel instance, as the export builds them. `on_ready(results)`
        gets some of them (name -> result) before the others are built."""
        raise NotImplementedError

    def evaluate(self, variant: Variant, prepared: dict, on_probe=None, slot: int = 0) -> dict:
        """Verify then time one variant on the GPU of `slot` (0 .. parallel - 1; one variant at a
        time per slot); a failure comes back as data with a reason. With `on_probe`, the first
        repetitions' timings are passed to it, and False prunes the variant (status "pruned",
        with those timings)."""
        raise NotImplementedError

    def retime(self, variants: list[Variant], prepared: dict[str, dict], objective: str,
               whole: bool = False, baseline: bool = False, check: bool = False) -> dict[str, dict]:
        """More careful timings of a few variants: name -> {"fwd": ..., "bwd": ...}. With `check`,
        each is checked in full first (at the problem's own sizes; built `whole`, at every word of
        its kind too); one that fails gives {"failed": message}. With
        `baseline`, the family's baseline (the torch op it replaces) is timed in the same turns,
        under `records.BASELINE`, where the family has one."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class LiveEvaluator(Evaluator):
    """Compile with nvcc, run in a worker process per GPU (`devices`, CUDA indices; all of one
    model). `problem` is a family's Problem (a dataclass with `family` and `key()`)."""

    def __init__(self, gpu: str, problem, objective: str, arch: str | None = None,
                 jobs: int | None = None, eval_timeout: float = 60.0, log_path: Path | None = None,
                 devices: list[int] | None = None):
        from tuner.measure.worker import Worker, warm_job

        self.devices = devices or [0]
        self.gpu = gpu
        self.problem = problem
        self.objective = objective
        self.jobs = jobs or os.cpu_count() or 1
        self.batch_size = max(2 * self.jobs, 8)
        self._binding = False  # the family's binding, started building with the first variants (for the export)
        self._info: dict | None = None
        self.gpu_name: str | None = None  # nvidia-smi's name for it: known before the workers start
        self._driver: str | None = None
        self.parallel = len(self.devices)
        self.host = searchers.host()
        def log(i: int) -> str | None:  # one log per worker
            return None if log_path is None else str(log_path) if self.parallel == 1 else f"{log_path}.{i}"

        # The workers start first: each imports torch and starts CUDA (seconds) while this
        # process, which needs neither, asks for and compiles the first batch.
        self.workers = [Worker(i, timeout=eval_timeout, log_path=log(i), warm=warm_job(problem, objective))
                        for i in self.devices]
        for w in self.workers:
            w.spawn()
        try:
            # The GPU's name and arch from nvidia-smi where it tells them; else from a worker's hello
            # (waited for: nothing compiles meanwhile). Several devices are told that way when
            # nvidia-smi shows them all as one model (its numbering may differ from CUDA's only
            # between models); the workers' hellos are checked against it later all the same.
            shown = [gpus.visible(i) for i in self.devices]
            seen = shown[0] if all(shown) and len({s.name for s in shown}) == 1 else None
            if seen is not None and not gpus.name_matches(seen.name, gpu):
                raise gpus.mismatch(gpu, seen.name)
            if seen is not None:
                self.gpu_name, self._driver = seen.name, seen.driver
            else:
                self.gpu_name = self.gpu_info["gpu_name"]
            self.arch = arch or (gpus.arch_of(gpu) if gpu.lower() != "auto"
                                 else seen.arch if seen else self.gpu_info["arch"])
            self.gpu_label = gpu if gpu.lower() != "auto" else gpus.short_name_of(self.gpu_name)
        except BaseException:
            self.close()
            raise

    def switch(self, problem) -> None:
        """Evaluate another problem of the same family from now on (`tuner search --problems`): the
        workers take the problem with each job; a restarted one warms up for this one."""
        from tuner.measure.worker import warm_job

        if problem.family != self.problem.family:
            self._binding = False  # another family's binding, started with its first variants
        self.problem = problem
        for w in self.workers:
            w.warm = warm_job(problem, self.objective)

    @property
    def gpu_info(self) -> dict:
        """What the study records of its GPU (name, arch, SMs, torch, CUDA, driver), from the
        workers' hellos: waits for them to start and warm up. Every device must be the model asked for."""
        if self._info is None:
            from tuner.measure.worker import WorkerError

            try:
                hellos = [w.ready().get("gpu") or {} for w in self.workers]
            except WorkerError as exc:
                raise GpuError(f"the GPU could not be started: {str(exc).strip().splitlines()[-1]}") from exc
            first = hellos[0]
            name = first.get("gpu_name", "")
            if not gpus.name_matches(name, self.gpu):
                raise gpus.mismatch(self.gpu, name)
            if self.gpu_name not in (None, name):
                raise GpuError(f"nvidia-smi shows device {self.devices[0]} as {self.gpu_name} and CUDA as {name}; "
                               "set CUDA_DEVICE_ORDER=PCI_BUS_ID so that both number GPUs alike")
            for index, other in zip(self.devices[1:], hellos[1:]):
                if other.get("gpu_name") != name:
                    raise GpuError(f"--devices: device {index} is {other.get('gpu_name')}, device "
                                   f"{self.devices[0]} is {name}; a study is measured on one GPU model")
            self._info = {**first, "driver": self._driver if self._driver is not None else gpus.driver_version()}
        return self._info

    @property
    def restarts(self) -> int:  # type: ignore[override]
        return sum(w.restarts for w in self.workers)

    @property
    def killed(self) -> int:  # type: ignore[override]
        return sum(w.killed for w in self.workers)

    def prepare(self, variants, whole=False, on_ready=None):
        if not self._binding:  # the export's, built beside the search (nothing here waits for it)
            self._binding = True
            from tuner.build import binding

            binding.build_in_background(self.problem.family)
        # each translation unit's variants as soon as it is built (`build.build(on_ready=...)`)
        unit = (lambda builds: on_ready({b.variant.name: _build_result(b) for b in builds})) if on_ready else None
        return {b.variant.name: _build_result(b) for b in self._build(variants, whole, unit)}

    def _build(self, variants, whole: bool, on_ready=None) -> list[build.Build]:
        # Only the kernel instances the problem runs (its reduction, its mode): what is verified
        # and timed; the export builds the whole variant.
        focus = None if whole else getattr(families.get(self.problem.family), "search_focus", None)
        return build.build(variants, self.arch, jobs=self.jobs, focus=focus(self.problem.__dict__) if focus else None,
                           on_ready=on_ready)

    def evaluate(self, variant, prepared, on_probe=None, slot=0):
        result = self.workers[slot].evaluate({
            "kind": "evaluate", "family": self.problem.family, "so": prepared["so"], "entry": prepared.get("entry"),
            "name": variant.name, "problem": self.problem.__dict__, "objective": self.objective,
            "timing": SEARCH_TIMING, "probe": PROBE_REPS if on_probe else 0}, on_probe)
        return {**result, "device": f"{self.host}/cuda:{self.devices[slot]}"}

    def retime(self, variants, prepared, objective, whole=False, baseline=False, check=False):
        jobs = [{"so": prepared[v.name]["so"], "entry": prepared[v.name].get("entry"), "name": v.name}
                for v in variants if prepared[v.name]["so"]]
        failed = {v.name: {"failed": f"compile error: {prepared[v.name].get('message', '')}"}
                  for v in variants if not prepared[v.name]["so"]}
        if check or whole:
            verdicts = self._checked(jobs, whole)
            for job in list(jobs):
                verdict = verdicts[job["name"]]
                if verdict["status"] != "ok":
                    failed[job["name"]] = {"failed": f"{verdict['reason']}: {verdict.get('message', '')}"}
                    jobs.remove(job)
        if not jobs:
            return failed
        job = {"kind": "retime", "family": self.problem.family, "kernels": jobs, "problem": self.problem.__dict__,
               "objective": objective, "baseline": baseline}
        if self.parallel == 1:
            return {**failed, **self.workers[0].evaluate(job).get("timings", {})}
        return {**failed, **self._retimed_everywhere(job)}

    def _retimed_everywhere(self, job: dict) -> dict[str, dict]:
        """The finalists re-timed on every GPU at once, each GPU with its share of the repetitions
        and of the GPU time: every finalist meets every GPU, so the comparison stays fair while the
        re-timing, which one GPU did alone, takes a share of its time. Their timings pooled
        (`pooled`)."""
        from tuner.measure.child import RETIME_TIMING

        share = {"min_reps": -(-RETIME_TIMING["min_reps"] // self.parallel),
                 "budget_ms": RETIME_TIMING["budget_ms"] / self.parallel}
        results = self._on_every_worker(lambda slot: self.workers[slot].evaluate({**job, "timing": share}))
        return pooled([r.get("timings", {}) for r in results])

    def _on_every_worker(self, work) -> list:
        """`work(slot)` for every worker's slot at once, a thread each (each waits on its own GPU)."""
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(self.parallel, thread_name_prefix="tuner-workers") as pool:
            return list(pool.map(work, range(self.parallel)))

    def _checked(self, jobs: list[dict], whole: bool) -> dict[str, dict]:
        """Each finalist checked in full, one job each (a finalist that crashes in another mode costs
        only itself), the jobs dealt over the workers in turn: a check's verdict is the same on any
        GPU of the study's model, and at the problem's own sizes (an embedding table of millions of
        rows) the checks take seconds. Name -> the worker's verdict."""
        def check(slot: int) -> dict[str, dict]:
            return {job["name"]: self.workers[slot].evaluate({"kind": "check", "family": self.problem.family,
                                                              "problem": self.problem.__dict__, "whole": whole, **job})
                    for job in jobs[slot::self.parallel]}

        if self.parallel == 1 or len(jobs) < 2:
            return check(0)
        return {name: verdict for part in self._on_every_worker(check) for name, verdict in part.items()}

    def close(self):
        for w in self.workers:
            w.close()


class SimulatedEvaluator(Evaluator):
    """Replays a measurement log (as Kernel Tuner's simulation mode does): no GPU, no compiler."""

    def __init__(self, path: Path, problem, objective: str, gpu: str, delay: float = 0.0, devices: int = 1):
        path = Path(path)
        self.parallel = devices  # simulated GPUs: evaluations run side by side as on real ones
        self.delay = delay  # seconds per evaluation, so that tests can kill a search mid-way
        self.table: dict[str, dict] = {}
        self.baseline: dict | None = None  # the baseline's timings, where the search recorded them
        info: dict = {}
        for rec in records.read_some(path, "--simulate"):
            if rec.get("problem") == problem.key() and isinstance(rec.get("baseline"), dict):
                self.baseline = {"status": "ok", **rec["baseline"]}
            if rec.get("problem") == problem.key() and isinstance(rec.get("variant"), str):
                self.table[rec["variant"]] = rec  # the last record of a variant wins
                info = rec.get("gpu") if isinstance(rec.get("gpu"), dict) else info
        if not self.table:
            raise TunerError(f"--simulate {path}: holds no measurements for problem {problem.key()}")
        recorded = str(info.get("gpu_name") or "")
        probe = gpus.Attached.__new__(gpus.Attached)  # the recording's GPU, by name alone
        probe.name = recorded
        if gpu.lower() != "auto" and recorded and not probe.matches(gpu):
            raise GpuError(f"--gpu {gpu} was asked for, but {path} was recorded on {recorded}")
        self.gpu_info = {**info, "simulated_from": str(path)}
        self.gpu_name = recorded or None
        # `auto` labels the study as a live search on that GPU would (H100, not its full name):
        # one study per GPU, however it was named
        self.gpu_label = gpu if gpu.lower() != "auto" else (gpus.short_name(probe) if recorded else "simulated")
        self.objective = objective
        self.batch_size = 16

    def _recorded(self, v) -> dict | None:
        """A variant's record; a joined one's is its forward half's forward and its backward half's backward."""
        halves = v.halves()
        if halves is None:
            return self.table.get(v.name)
        fwd, bwd = (self.table.get(h.name) or {} for h in halves)
        if fwd.get("status") != "ok" or bwd.get("status") != "ok" or "bwd" not in bwd:
            return None
        return {"status": "ok", "fwd": fwd["fwd"], "bwd": bwd["bwd"]}

    def prepare(self, variants, whole=False, on_ready=None):
        out = {}
        for v in variants:
            rec = self._recorded(v)
            if rec is None:
                out[v.name] = {"status": "fail", "reason": "not recorded",
                               "message": f"{v.name} is not in the simulation file", "compiled": False}
            elif rec.get("reason") == "compile error":
                out[v.name] = {k: rec.get(k) for k in ("status", "reason", "message", "compile_s")}
                out[v.name]["compiled"] = False
            else:
                out[v.name] = {"status": "ok", "compiled": False, "so": None,
                               **{k: rec.get(k) for k in ("compile_s", "regs_fwd", "regs_bwd", "spill_bytes")}}
                if on_ready:  # as a build's units come: the replay goes the live search's way
                    on_ready({v.name: out[v.name]})
        return out

    def evaluate(self, variant, prepared, on_probe=None, slot=0):
        if self.delay:
            import time

            time.sleep(self.delay)
        rec = self.table[variant.name]
        keep = ("status", "reason", "message", "fwd", "bwd", "loss_error", "grad_error", "verify_s", "time_s")
        result = {k: rec[k] for k in keep if k in rec}
        if on_probe and result.get("status") in ("ok", "pruned"):  # the recorded times stand for a probe
            probe = {k: result[k] for k in ("fwd", "bwd") if k in result}
            result["status"] = "ok" if on_probe(probe) and result["status"] == "ok" else "pruned"
        return {**result, "device": f"simulated/{slot}"}

    def retime(self, variants, prepared, objective, whole=False, baseline=False, check=False):
        recorded = {v.name: self._recorded(v) or {} for v in variants}
        if baseline and self.baseline:  # a recording that holds the baseline's timings replays them too
            recorded[records.BASELINE] = self.baseline
            if "variant_extra" in self.baseline:
                recorded[records.BASELINE_EXTRA] = {"status": "ok", "bwd": self.baseline["variant_extra"]}
        return {name: {k: rec[k] for k in ("fwd", "bwd") if k in rec}
                for name, rec in recorded.items() if rec.get("status") == "ok"}
