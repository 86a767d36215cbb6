"""`tuner search`: an Optuna study that compiles, verifies and times variants.

Per batch: ask Optuna for several trials, map each to a valid variant, skip the
ones the study already knows (their result is copied), compile the rest in
parallel (while the GPUs evaluate the previous batch), then verify and time them
in the worker processes, one variant at a time per GPU, and tell Optuna. A
variant clearly slower than the best after a short probe is pruned. Failures are
data: each becomes a FAILED trial with a `reason`. Several searchers (processes,
hosts) can share a study: none evaluates a variant another has, and each runs
until the study has its trials. At the end the top k are timed again,
interleaved, with more repetitions, and the winner is picked on that.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tuner import families, gpus, paths, records
from tuner import study as studies
from tuner.evaluate import Evaluator, LiveEvaluator, SimulatedEvaluator
from tuner.pruning import DEFAULT_FACTOR, pruner
from tuner.variant import Variant

OBJECTIVES = ("fwd", "bwd", "fwd+bwd")
SAMPLERS = ("tpe", "random", "grid")


@dataclass
class SearchConfig:
    gpu: str
    problem: Any  # a family's Problem: a dataclass with `family` and `key()`
    trials: int = 200
    timeout: float | None = None
    sampler: str = "tpe"
    storage: str | None = None
    study: str | None = None
    objective: str = "fwd+bwd"
    simulate: Path | None = None
    simulate_delay: float = 0.0
    arch: str | None = None
    jobs: int | None = None
    batch: int | None = None
    top_k: int = 5
    eval_timeout: float = 60.0
    plant_faults: tuple[str, ...] = ()  # test only: variants with these faults (see the family's FAULTS)
    import_records: Path | None = None
    seed: int | None = None
    progress: bool = True
    prune: float | None = DEFAULT_FACTOR  # prune variants this much slower than the best; None: time all
    devices: str | None = None  # "all" or CUDA indices "0,1": a worker per GPU; None: device 0
    # called with the best objective so far after each trial is told; True stops asking for
    # more (trials already asked are still finished), as a timeout does
    stop_when: Callable[[float], bool] | None = None


@dataclass
class SearchReport:
    study_name: str
    records_path: Path
    trials: int = 0
    evaluated: int = 0
    compiled: int = 0
    duplicates: int = 0
    pruned: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    requeued: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    compile_s: float = 0.0
    verify_s: float = 0.0
    time_s: float = 0.0
    winner: dict[str, Any] | None = None
    retimed: list[dict[str, Any]] = field(default_factory=list)
    worker_restarts: int = 0
    worker_kills: int = 0
    imported: int = 0


def objective_value(result: dict, objective: str) -> float:
    fwd = result.get("fwd", {}).get("median_us", 0.0)
    bwd = result.get("bwd", {}).get("median_us", 0.0)
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[objective]


def _sampler(name: str, seed: int | None):
    import optuna

    if name == "tpe":
        import warnings

        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=20)
    # grid and random take unseen variants in a shuffled order (see _order); the sampler fills any gap
    return optuna.samplers.RandomSampler(seed=seed)


def _distributions(space) -> dict:
    from optuna.distributions import CategoricalDistribution

    return {d.name: CategoricalDistribution(list(d.values)) for d in space.dims}


def _order(space, seed: int | None) -> list[Variant]:
    """Every variant in a shuffled order, which random and grid take unseen variants from:
    sampling without replacement (Optuna's RandomSampler draws a variant again when its
    parameters repeat), and a partial grid spread over the space."""
    import random

    variants = list(space)
    random.Random(seed if seed is not None else random.SystemRandom().random()).shuffle(variants)
    return variants


class Search:
    def __init__(self, cfg: SearchConfig, evaluator: Evaluator):
        import optuna

        self.cfg = cfg
        self.evaluator = evaluator
        self.family = families.get(cfg.problem.family)
        self.space = self.family.space_for(cfg.problem.__dict__)
        self.dists = _distributions(self.space)
        self.name = _study_name(cfg, evaluator.gpu_label)
        self.storage = studies.storage(cfg.storage)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = studies.create(self.name, self.storage, _sampler(cfg.sampler, cfg.seed), pruner(cfg.prune))
        self._record_identity()
        self.records_path = studies.records_path(self.name)
        self.report = SearchReport(self.name, self.records_path)
        self._results: dict[str, tuple[int, dict]] = {}  # variant -> (trial number, outcome)
        # random and grid: the variants still to try, the next one last (popped); tpe proposes its own
        self._queue = _order(self.space, cfg.seed)[::-1] if cfg.sampler in ("random", "grid") else None
        self._seen: set[str] = set()  # variants the study has, in any state, as last read
        self._waiting = 0  # queued trials in the study (retries, planted faults), as last read
        self._best: float | None = None
        self._probed: set[int] = set()  # trials that reported a probe
        self._heartbeat = studies.Heartbeat(self.study, self.storage)
        self._lock = threading.Lock()
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(evaluator.parallel):
            self._slots.put(slot)
        self._gpus = concurrent.futures.ThreadPoolExecutor(max_workers=evaluator.parallel,
                                                           thread_name_prefix="tuner-gpu")
        self._stopped = False
        self._bar = None

    def _record_identity(self) -> None:
        attrs = self.study.user_attrs
        identity = {"family": self.family.FAMILY, "problem": self.cfg.problem.__dict__, "objective": self.cfg.objective,
                    "gpu": self.evaluator.gpu_info}
        for key, value in identity.items():
            if key not in attrs:
                self.study.set_user_attr(key, value)
        known = attrs.get("gpu", {}).get("gpu_name")
        if known and known != self.evaluator.gpu_info.get("gpu_name"):
            from tuner.errors import GpuError

            raise GpuError(f"study {self.name!r} was measured on {known}, not on "
                           f"{self.evaluator.gpu_info.get('gpu_name')}; pass another --study name")

    # ------------------------------------------------------------ trials

    def _ask(self, n: int) -> list[tuple[Any, Variant]]:
        """n new trials: queued ones first (Optuna's ask takes them), then the next unseen
        variants of random and grid (claimed in one write each), or tpe's proposals."""
        import optuna

        asked = []
        me = studies.owner()
        for _ in range(n):
            variant = self._next_unseen() if self._queue is not None and self._waiting <= 0 else None
            if variant is not None:
                trial = studies.claim(self.study, self.space.tuned(variant), self.dists,
                                      {"variant": variant.name, "owner": me})
            else:
                self._waiting -= 1
                trial = self.study.ask(self.dists)
                variant = self.space.nearest(trial.params)
                if trial.user_attrs.get("fault"):
                    variant = variant.replace(fault=trial.user_attrs["fault"])
                try:
                    _set_user_attrs(trial, {"variant": variant.name, "owner": me})
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # failed as ownerless by another searcher (this one stalled): queued again
            self._seen.add(variant.name)
            asked.append((trial, variant))
        return asked

    def _own_order(self) -> None:
        """Searchers of one study given the same --seed would take the same variants in step,
        each waiting on the other's copy: the second to arrive with a seed shuffles by its own."""
        if self._queue is None or self.cfg.seed is None:
            return
        study_id = self.storage.get_study_id_from_name(self.name)
        key, me = f"tuner:seed:{self.cfg.seed}", studies.owner()
        taken = self.storage.get_study_system_attrs(study_id).get(key)
        if taken not in (None, me):
            self._queue = _order(self.space, hash((self.cfg.seed, me)) & 0xFFFF_FFFF)[::-1]
        else:
            self.storage.set_study_system_attr(study_id, key, me)

    def _next_unseen(self) -> Variant | None:
        """None when every variant is in the study: Optuna's sampler then fills the count."""
        while self._queue:
            variant = self._queue.pop()
            if variant.name not in self._seen:
                return variant
        return None

    def _tell(self, trial, variant: Variant, result: dict, duplicate_of: int | None = None) -> bool:
        """Tell the study; False when another searcher failed the trial meanwhile (this one was cut
        off from the study for too long): it was queued again, and runs again from there."""
        import optuna

        attrs = result_attrs(result)
        if duplicate_of is not None:
            attrs["result"]["duplicate_of"] = duplicate_of
        value = objective_value(result, self.cfg.objective) if result["status"] == "ok" else None
        state = {"ok": "COMPLETE", "pruned": "PRUNED"}.get(result["status"], "FAIL")
        try:
            _set_user_attrs(trial, attrs)
            if state == "PRUNED" and trial.number not in self._probed:  # a copied outcome: what was measured then
                trial.report(objective_value(result, self.cfg.objective), 0)
            told = self.study.tell(trial, value if state == "COMPLETE" else None,
                                   state=optuna.trial.TrialState[state], skip_if_finished=True)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        if told.state.name != state or (state == "FAIL" and told.user_attrs.get("reason") != attrs["reason"]):
            return False
        if duplicate_of is not None:
            self.report.duplicates += 1
        if state == "PRUNED":
            self.report.pruned += 1
        elif state == "FAIL":
            self.report.failed[attrs["reason"]] = self.report.failed.get(attrs["reason"], 0) + 1
        if value is not None:
            self._best = value if self._best is None else min(self._best, value)
            self._stopped = self._stopped or bool(self.cfg.stop_when and self.cfg.stop_when(self._best))
        self.report.trials += 1
        if self._bar is not None:
            self._bar.update(1)
            if self._best is not None:
                self._bar.set_postfix_str(f"best {self._best:.2f} us")
        return True

    @staticmethod
    def _copy(prior) -> dict:
        """A finished trial's outcome, in the form `evaluate` returns."""
        a = studies.facts(prior)
        result = {k: a.get(k) for k in ("compile_s", "regs_fwd", "regs_bwd", "spill_bytes", "loss_error",
                                        "grad_error")}
        if prior.state.name in ("COMPLETE", "PRUNED"):
            result["status"] = "ok" if prior.state.name == "COMPLETE" else "pruned"
            result["fwd"] = {"median_us": a.get("fwd_us", 0.0), "spread_us": a.get("fwd_spread_us", 0.0)}
            if "bwd_us" in a:
                result["bwd"] = {"median_us": a["bwd_us"], "spread_us": a.get("bwd_spread_us", 0.0)}
        else:
            result.update(status="fail", reason=a.get("reason", "error"), message=a.get("message", ""))
        return result

    def _refresh(self) -> dict[str, int]:
        """Read the study once: finished outcomes into the cache; running trials by variant."""
        running: dict[str, int] = {}
        for t in self.study.get_trials(deepcopy=False):
            name = t.user_attrs.get("variant")
            if t.state.name == "WAITING":
                self._seen.add(self.space.nearest(t.params).name)
            if name is None:
                continue
            self._seen.add(name)
            if t.state.name == "RUNNING":
                running[name] = min(running.get(name, t.number), t.number)
            elif name not in self._results and (t.state.name in ("COMPLETE", "PRUNED") or (
                    t.state.name == "FAIL" and not studies.interrupted(t))):
                self._results[name] = (t.number, self._copy(t))
        return running

    def _settle_known(self, batch):
        """Tell the trials whose variant the study already measured; return (new, still running
        elsewhere: the run loop waits for those)."""
        running = self._refresh()
        new, waiting = [], []
        for trial, variant in batch:
            if variant.name in self._results:
                number, result = self._results[variant.name]
                self._tell(trial, variant, result, duplicate_of=number)
            elif running.get(variant.name, trial.number) < trial.number:
                waiting.append((trial, variant))  # an earlier trial evaluates it now
            else:
                new.append((trial, variant))
        return new, waiting

    def _evaluate(self, batch, prepared: dict[str, dict]) -> None:
        """Each new variant of the batch once, on as many GPUs as the evaluator has (a slot each);
        the batch's other trials of the same variant copy its result."""
        first: dict[str, tuple] = {}
        copies = []
        for trial, variant in batch:
            if variant.name in self._results or variant.name in first:
                copies.append((trial, variant))
            else:
                first[variant.name] = (trial, variant)
        if self.evaluator.parallel == 1:
            for trial, variant in first.values():
                self._evaluate_one(trial, variant, prepared[variant.name], 0)
        else:
            futures = [self._gpus.submit(self._in_a_slot, trial, variant, prepared[variant.name])
                       for trial, variant in first.values()]
            for f in futures:
                f.result()
        for trial, variant in copies:
            number, result = self._results[variant.name]
            self._tell(trial, variant, result, duplicate_of=number)

    def _in_a_slot(self, trial, variant, build) -> None:
        slot = self._slots.get()
        try:
            self._evaluate_one(trial, variant, build, slot)
        finally:
            self._slots.put(slot)

    def _evaluate_one(self, trial, variant, build: dict, slot: int) -> None:
        if build["status"] != "ok":
            result = build
        else:
            probe = (lambda partial, t=trial: self._probe(t, partial)) if self.cfg.prune else None
            result = {**build, **self.evaluator.evaluate(variant, build, probe, slot)}
        with self._lock:  # the study, the records and the report are shared by the slots
            if build["status"] == "ok":
                self.report.evaluated += 1
            self.report.verify_s += result.get("verify_s", 0.0)
            self.report.time_s += result.get("time_s", 0.0)
            # The study first: a searcher killed before its result landed leaves the trial running,
            # to be failed and run again, and no record of a measurement the study never got.
            if not self._tell(trial, variant, result):
                return
            self._results[variant.name] = (trial.number, result)
            records.append(self.records_path, {
                "study": self.name, "gpu": self.evaluator.gpu_info, "problem": self.cfg.problem.key(),
                "objective": self.cfg.objective, "variant": variant.name, "params": self.space.tuned(variant),
                **{k: v for k, v in result.items() if k not in ("so",)}, "at": time.time(),
            })

    def _probe(self, trial, partial: dict) -> bool:
        """The first repetitions' objective as the trial's intermediate value; go on unless the
        study's pruner says prune (or another searcher failed the trial meanwhile: `_tell` drops it)."""
        import optuna

        try:
            trial.report(objective_value(partial, self.cfg.objective), partial["fwd"].get("reps", 0))
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        self._probed.add(trial.number)
        return not trial.should_prune()

    # -------------------------------------------------------------- run

    def run(self) -> SearchReport:
        from tqdm import tqdm

        cfg = self.cfg
        started = time.monotonic()
        studies.register()
        self.report.requeued = studies.fail_interrupted(self.study, self.storage)
        if cfg.import_records:
            self.report.imported = self.import_records(cfg.import_records)
        self._plant(cfg.plant_faults)  # queued, so that they run first
        self._own_order()
        self._refresh()  # what the study has seen already
        done = studies.finished_count(self.study)
        # A sampler that learns between batches (tpe) gets smaller ones; a queue of variants does not.
        batch_size = cfg.batch or self.evaluator.batch_size * (1 if cfg.sampler == "tpe" else 4)
        if cfg.progress:
            self._bar = tqdm(total=cfg.trials, initial=min(done, cfg.trials), desc=self.name, unit="trial",
                             dynamic_ncols=True, leave=True, disable=None)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        pending = None  # (batch of new trials, future of their builds): compiles while the GPU works
        waiting: list = []  # trials whose variant another process is evaluating right now
        others_deadline = None
        try:
            while True:
                following = None
                out_of_time = cfg.timeout is not None and time.monotonic() - started > cfg.timeout
                mine = {t.number for t, _ in (pending[0] if pending else []) + waiting}
                now = studies.tally(self.study)
                self._waiting = now.waiting
                others = now.running - mine  # other searchers' trials: they count as underway
                room = cfg.trials - now.done - len(mine) - len(others)
                if room > 0 and not out_of_time and not self._stopped:
                    new, held = self._settle_known(self._ask(min(batch_size, room)))
                    waiting += held
                    following = (new, pool.submit(self._prepare, _unique(new)))
                if pending is None and following is None:
                    others_deadline = others_deadline or time.monotonic() + 3 * cfg.eval_timeout + 600
                    if (waiting or others) and time.monotonic() < others_deadline:
                        # Trials of other searchers: they finish (a copy settles ours of the same
                        # variant), or their searcher died and they are failed (heartbeats, or its
                        # pid here) and queued again; either way the count is reached.
                        if waiting:
                            new, waiting = self._settle_known(waiting)
                            if new:  # the earlier trial failed: evaluate them here
                                self._evaluate(new, self._prepare(_unique(new)))
                                continue
                        if waiting or not (out_of_time or self._stopped):
                            self.report.requeued += studies.fail_interrupted(self.study, self.storage)
                            time.sleep(1.0)
                            continue
                    break
                if pending is not None:
                    self._evaluate(pending[0], pending[1].result())
                pending = following
            if waiting:  # still waiting at the deadline: evaluate them here
                new, held = self._settle_known(waiting)
                self._evaluate(new + held, self._prepare(_unique(new + held)))
        finally:
            pool.shutdown(wait=True)
            self._gpus.shutdown(wait=True)
            self._heartbeat.close()
            if self._bar is not None:
                self._bar.close()
        if self.report.evaluated or "winner" not in self.study.user_attrs:
            self._retime()
        else:
            self.report.winner = self.study.user_attrs["winner"]
            self.report.retimed = self.study.user_attrs.get("retimed", [])
        self.report.wall_s = time.monotonic() - started
        self.report.worker_restarts = self.evaluator.restarts
        self.report.worker_kills = self.evaluator.killed
        return self.report

    def import_records(self, path: Path) -> int:
        """Add measurements from a log (another run's, or a recording) as finished trials, so the
        search does not evaluate those variants again. Only records of this problem and GPU count."""
        import optuna

        known = {t.user_attrs.get("variant") for t in self.study.get_trials(deepcopy=False)}
        by_name = {v.name: v for v in self.space}
        gpu = self.evaluator.gpu_info.get("gpu_name")
        added = 0
        for rec in records.read(Path(path)):
            v = by_name.get(rec.get("variant"))
            if (v is None or v.name in known or rec.get("problem") != self.cfg.problem.key()
                    or rec.get("gpu", {}).get("gpu_name") != gpu or rec.get("objective") != self.cfg.objective):
                continue
            status = rec.get("status")
            value = objective_value(rec, self.cfg.objective) if status in ("ok", "pruned") else None
            state = {"ok": "COMPLETE", "pruned": "PRUNED"}.get(status, "FAIL")
            attrs = {"variant": v.name, "imported_from": str(path), **result_attrs(rec)}
            self.study.add_trial(optuna.trial.create_trial(
                params=self.space.tuned(v), distributions=self.dists, value=value,
                intermediate_values={0: value} if state == "PRUNED" else None,
                state=optuna.trial.TrialState[state], user_attrs=attrs))
            known.add(v.name)
            added += 1
        return added

    def _plant(self, faults) -> None:
        """Queue one variant per planted fault (once per study), ahead of the sampler's picks."""
        known = {t.user_attrs.get("fault") for t in self.study.get_trials(deepcopy=False)}
        base = self.space.tuned(next(iter(self.space)))
        for fault in faults:
            if fault not in self.family.FAULTS:
                from tuner.errors import TunerError

                raise TunerError(f"unknown fault {fault!r}; known: {', '.join(self.family.FAULTS)}")
            if fault not in known:
                self.study.enqueue_trial(base, user_attrs={"fault": fault, "owner": studies.owner()})

    def _prepare(self, variants: list[Variant]) -> dict[str, dict]:
        started = time.monotonic()
        prepared = self.evaluator.prepare(variants)
        self.report.compile_s += time.monotonic() - started
        self.report.compiled += sum(1 for b in prepared.values() if b.get("compiled"))
        return prepared

    def _retime(self) -> None:
        frame = studies.trials_frame(self.study, self.space)
        if frame.empty or not (frame["state"] == "COMPLETE").any():
            return
        best = studies.top(frame, self.cfg.top_k)
        by_name = {v.name: v for v in self.space}
        variants = [by_name[name] for name in best["variant"] if name in by_name]
        timings = self.evaluator.retime(variants, self._prepare(variants), self.cfg.objective)
        rows = []
        for v in variants:
            t = timings.get(v.name)
            if t is None:
                continue
            rows.append({"variant": v.name, "params": self.space.tuned(v), **t,
                         "objective_us": objective_value(t, self.cfg.objective)})
        rows.sort(key=lambda r: r["objective_us"])
        if rows:
            self.report.retimed = rows
            self.report.winner = rows[0]
            self.study.set_user_attr("retimed", rows)
            self.study.set_user_attr("winner", rows[0])


def result_attrs(result: dict) -> dict:
    """A result's facts as trial user attributes (what `show`, `report` and `export` read through
    `study.facts`): the measurement packed in one, `result` (one write to the storage where a
    key each made a dozen), and a failure's reason and message beside it, to filter on."""
    facts = {k: result.get(k) for k in ("compile_s", "regs_fwd", "regs_bwd", "spill_bytes", "device")}
    attrs: dict[str, Any] = {}
    if result.get("status") in ("ok", "pruned"):
        facts.update(fwd_us=result["fwd"]["median_us"], fwd_spread_us=result["fwd"]["spread_us"],
                     loss_error=result.get("loss_error"), grad_error=result.get("grad_error"))
        if "bwd" in result:
            facts.update(bwd_us=result["bwd"]["median_us"], bwd_spread_us=result["bwd"]["spread_us"])
    else:
        attrs.update(reason=result.get("reason", "error"), message=str(result.get("message", ""))[:2000])
    return {"result": {k: v for k, v in facts.items() if v is not None}, **attrs}


def _set_user_attrs(trial, attrs: dict) -> None:
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def _unique(batch) -> list[Variant]:
    return list({v.name: v for _, v in batch}.values())


def _study_name(cfg: SearchConfig, gpu_label: str) -> str:
    return cfg.study or studies.study_name(cfg.problem.family, gpu_label, cfg.problem.key(), cfg.objective)


def finished(cfg: SearchConfig) -> SearchReport | None:
    """The report of a study that already has its trials and its winner, read without starting
    CUDA, when the attached GPU (as nvidia-smi names it) is the one it was measured on; else None."""
    import optuna

    if cfg.simulate or cfg.plant_faults or cfg.import_records or cfg.gpu.lower() == "auto":
        return None
    name = _study_name(cfg, cfg.gpu)
    try:
        st = optuna.load_study(study_name=name, storage=studies.storage(cfg.storage))
    except KeyError:
        return None
    attrs = st.user_attrs
    gpu = gpus.visible_name()
    if (gpu is None or gpu != attrs.get("gpu", {}).get("gpu_name") or "winner" not in attrs
            or studies.finished_count(st) < cfg.trials
            or st.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,
                                                     optuna.trial.TrialState.WAITING))):
        return None
    return SearchReport(name, studies.records_path(name), winner=attrs["winner"], retimed=attrs.get("retimed", []))


def run(cfg: SearchConfig) -> SearchReport:
    started = time.monotonic()
    report = finished(cfg)
    if report is not None:
        report.wall_s = time.monotonic() - started
        return report
    if cfg.simulate:
        simulated = 1 if cfg.devices in (None, "all") else len(gpus.device_indices(cfg.devices))
        evaluator: Evaluator = SimulatedEvaluator(cfg.simulate, cfg.problem, cfg.objective, cfg.gpu,
                                                  cfg.simulate_delay, devices=simulated)
    else:
        paths.studies_dir().mkdir(parents=True, exist_ok=True)
        evaluator = LiveEvaluator(cfg.gpu, cfg.problem, cfg.objective, arch=cfg.arch, jobs=cfg.jobs,
                                  eval_timeout=cfg.eval_timeout, log_path=paths.studies_dir() / "worker.log",
                                  devices=gpus.device_indices(cfg.devices))
    try:
        return Search(cfg, evaluator).run()
    finally:
        evaluator.close()
