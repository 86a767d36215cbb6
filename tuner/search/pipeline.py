"""The search's run loop: ask a batch, compile it while the GPUs evaluate the previous one,
tell the study, and end with the finalists.

Per batch: `asking` claims new trials, `recording` settles those whose variant the study
already measured (their result is copied), the rest compile in a thread (`evaluator.prepare`)
while the previous batch is verified and timed, one variant at a time per GPU; a batch's
variants are evaluated as their translation units end, not once all have. A variant
clearly slower than the best after a short probe is pruned. Failures are data: each becomes a
FAILED trial with a `reason`. Several searchers (processes, hosts) can share a study: none
evaluates a variant another has, and each runs until the study has its trials, or until every
variant of the space has a finished trial (--trials above the space's size).
"""

from __future__ import annotations

import concurrent.futures
import queue
import sys
import threading
import time

from tuner import families, gpus, paths
from tuner.store import records, searchers
from tuner.store import study as studies
from tuner.search.evaluate import Evaluator, LiveEvaluator, SimulatedEvaluator
from tuner.search.pruning import SlowerThanBest, best_value, pruner
from tuner.search.ranking import one_blas_thread
from tuner.store.records import objective_value
from tuner.search import asking, finalists, heartbeat
from tuner.search.config import SearchConfig, SearchReport
from tuner.search.recording import Book
from tuner.variant import Variant


class Search:
    def __init__(self, cfg: SearchConfig, evaluator: Evaluator):
        import optuna

        self.cfg = cfg
        self.evaluator = evaluator
        self.family = families.get(cfg.problem.family)
        self.space = self.family.space_for(cfg.problem.__dict__)
        self.name = cfg.study_name(evaluator.gpu_label)
        self.storage = studies.storage(cfg.storage)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.records_path = studies.records_path(self.name)
        records.writable(self.records_path)  # before the study: a log it cannot write fails now, not at a trial
        prune = pruner(cfg.prune)
        self.study = studies.create(self.name, self.storage, asking.sampler(cfg.sampler, cfg.seed), prune)
        self.report = SearchReport(self.name, self.records_path)
        self.book = Book(cfg, self.study, self.space, asking.distributions(self.space),
                         lambda: evaluator.gpu_info, self.report)
        self._prior_best: float | None = None  # the study's best before this run (`run`)
        if isinstance(prune, SlowerThanBest):  # the best as told here: no scan of the study a probe
            prune.best = self._best_known
        self.book.record_identity(self.family.FAMILY, evaluator.gpu_name)
        self.asker = asking.Asker(cfg, self.book, self.space, self.storage, self.family.FAMILY)
        self.joins = finalists.joins(cfg, self.space)  # the halves count apart (pruning, ranked picks)
        self._heartbeat = heartbeat.Heartbeat(self.study, self.storage)
        self._lock = threading.Lock()
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(evaluator.parallel):
            self._slots.put(slot)
        self._gpus = concurrent.futures.ThreadPoolExecutor(max_workers=evaluator.parallel,
                                                           thread_name_prefix="tuner-gpu")
        # A measured variant is told to the study (a journal write, the log) in a thread of its own,
        # in order, while its GPU takes the next one: ~2 ms a variant the GPU no longer waits for.
        self._recorder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuner-record")
        self._recording: list[concurrent.futures.Future] = []

    # -------------------------------------------------------------- run

    def run(self) -> SearchReport:
        from tqdm import tqdm

        cfg, book = self.cfg, self.book
        started = self.report.started = time.monotonic()
        searchers.register()
        self.report.requeued = studies.fail_interrupted(self.study, self.storage)
        if cfg.import_records:
            self.report.imported = book.import_records(cfg.import_records)
        book.plant(cfg.plant_faults, self.family.FAULTS)  # queued, so that they run first
        self.asker.start()
        book.refresh()  # what the study has seen already
        self._prior_best = best_value(self.study)
        done = studies.finished_count(self.study)
        # Larger batches compile more variants per translation unit (nvcc's fixed cost paid fewer
        # times); TPE learns between batches and asks one trial at a time: smaller ones. A batch
        # compiles in one piece: the GPU's share of a variant (~30 ms) is a fraction of its
        # compile (~1 s of a core), so compiling is the limit, and a unit of 8 variants costs
        # 30% less per variant than two of 4 (nvcc's host pass, ~2.5 s a unit, paid once).
        # The GPU evaluates a batch while the next one compiles.
        batch_size = cfg.batch or self.evaluator.batch_size * (1 if cfg.sampler == "tpe" else 4)
        piece = max(batch_size, 1)
        if cfg.progress:
            book.bar = tqdm(total=cfg.trials, initial=min(done, cfg.trials), desc=self.name, unit="trial",
                            dynamic_ncols=True, leave=True, disable=None)
        # Two builds at once: the next batch's units queue behind the last one's (one compile
        # queue, tuner.build.queue) and take each core its last units leave.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
        pending = None  # [_Piece]: a batch's new trials, compiling while the GPU works
        waiting: list = []  # trials whose variant another process is evaluating right now
        others_deadline = None
        ahead = False  # the likely finalists' whole builds started (`_likely_finalists`)
        try:
            while True:
                following = None
                out_of_time = cfg.timeout is not None and time.monotonic() - started > cfg.timeout
                mine = {t.number for piece in pending or [] for t, _ in piece.part} | {t.number for t, _ in waiting}
                now = studies.tally(self.study)
                book.waiting = now.waiting
                others = now.running - mine  # other searchers' trials: they count as underway
                room = cfg.trials - now.done - len(mine) - len(others)
                spent = room <= 0 or out_of_time or book.stopped
                # Once every variant has a trial, those underway (here or elsewhere) are waited for
                # rather than copied; one that fails as interrupted is queued again, and asked for.
                if not spent and not self.asker.exhausted():
                    size = self.asker.first_batch if self.asker.learns and not book.results else batch_size
                    new, held = book.settle_known(self.asker.ask(min(size, room)))
                    waiting += held
                    following = [_Piece(part, pool, self._prepare)
                                 for part in (new[i:i + piece] for i in range(0, len(new), piece))]
                if pending is None and following is None:
                    others_deadline = others_deadline or time.monotonic() + 3 * cfg.eval_timeout + 600
                    if (waiting or others) and time.monotonic() < others_deadline:
                        # Trials of other searchers: they finish (a copy settles ours of the same
                        # variant), or their searcher died and they are failed (heartbeats, or its
                        # pid here) and queued again; either way the count is reached.
                        if waiting:
                            new, waiting = book.settle_known(waiting)
                            if new:  # the earlier trial failed: evaluate them here
                                self._evaluate(new, self._prepare(_unique(new)))
                                continue
                        if waiting or not (out_of_time or book.stopped):
                            self.report.requeued += studies.fail_interrupted(self.study, self.storage)
                            time.sleep(1.0)
                            continue
                    break
                if pending is None and following is not None and self.asker.learns and not book.results:
                    # The first batch is evaluated before the second is asked: a model that ranked
                    # the second knowing nothing would spend it at random.
                    self._evaluate_pieces(following)
                    following = None
                if pending is not None:
                    if following is None and not ahead and (getattr(self.family, "FINALISTS_WHOLE", False)
                                                            or finalists.joins(self.cfg, self.space)):
                        ahead = True  # the last batch: the compiler is idle while the GPU evaluates it
                        likely = self._likely_finalists()
                        if likely:
                            pool.submit(self._prepare, likely, True)
                    self._evaluate_pieces(pending)
                pending = following
            if waiting:  # still waiting at the deadline: evaluate them here
                new, held = book.settle_known(waiting)
                self._evaluate(new + held, self._prepare(_unique(new + held)))
        finally:
            pool.shutdown(wait=True)
            self._gpus.shutdown(wait=True)
            self._recorder.shutdown(wait=True)  # what was measured is told, an interrupted search's too
            self._heartbeat.close()
            if book.bar is not None:
                book.bar.close()
        if not spent:  # stopped short of --trials: the space ran out, or another searcher's trial did not end
            book.refresh()  # the outcomes other searchers told while this one waited
        measured = len(self.asker.names & book.results.keys())
        if not spent and measured == len(self.space):
            print(f"{self.name}: every variant of the space is measured: {measured:,} of --trials {cfg.trials}",
                  file=sys.stderr)
        if self.report.evaluated or "winner" not in self.study.user_attrs:
            begun = time.monotonic()
            finalists.retime(cfg, self.study, self.space, self.evaluator, self._prepare, self.report)
            self.report.spans.append(("finalists", begun, time.monotonic()))
        else:
            self.report.winner = self.study.user_attrs["winner"]
            self.report.retimed = self.study.user_attrs.get("retimed", [])
        self.report.wall_s = time.monotonic() - started
        # two builds overlap (a batch's units queue behind the last one's): the time any build ran
        self.report.compile_s = self.report.busy("compile")
        self.report.worker_restarts = self.evaluator.restarts
        self.report.worker_kills = self.evaluator.killed
        return self.report

    # --------------------------------------------------------- evaluate

    def _prepare(self, variants: list[Variant], whole: bool = False, ready: queue.Queue | None = None) -> dict[str, dict]:
        started = time.monotonic()
        prepared = self.evaluator.prepare(variants, whole, on_ready=ready.put if ready is not None else None)
        self.report.spans.append(("compile", started, time.monotonic()))
        self.report.compiled += sum(1 for b in prepared.values() if b.get("compiled"))
        return prepared

    def _likely_finalists(self) -> list[Variant]:
        """The best few so far, and the best forward joined to the best backward where that is
        the family's way (`finalists.joined`): built whole (`FINALISTS_WHOLE`) while the last batch
        is evaluated, most of them are the finalists, whose whole builds are then found done."""
        ok = {name: result for name, (_, result) in self.book.results.items()
              if result.get("status") == "ok" and "fwd" in result}
        by_name = self.space.by_name()
        best = sorted(ok, key=lambda n: objective_value(ok[n], self.cfg.objective))[:self.cfg.top_k]
        likely = [by_name[name] for name in best if name in by_name]
        if finalists.joins(self.cfg, self.space):
            extra = finalists.joined(by_name, {n: (r["fwd"]["median_us"], r["bwd"]["median_us"])
                                                  for n, r in ok.items() if n in by_name and "bwd" in r})
            likely += [extra] if extra is not None else []
        return likely

    def _evaluate_pieces(self, pieces: list[_Piece]) -> None:
        """Each piece's variants as their builds come (a translation unit at a time), the rest
        once its whole build has ended."""
        for piece in pieces:
            for part, prepared in piece.parts():
                started = time.monotonic()
                _ = self.book.gpu_info  # the first time, waits for the GPU's worker to start and warm up: not GPU work
                if time.monotonic() - started > 0.01:
                    self.report.spans.append(("gpu start", started, time.monotonic()))
                    started = time.monotonic()
                self._evaluate(part, prepared)
                self.report.spans.append(("gpu", started, time.monotonic()))

    def _evaluate(self, batch, prepared: dict[str, dict]) -> None:
        """Each new variant of the batch once, on as many GPUs as the evaluator has (a slot each);
        the batch's other trials of the same variant copy its result."""
        first: dict[str, tuple] = {}
        copies = []
        for trial, variant in batch:
            if variant.name in self.book.results or variant.name in first:
                copies.append((trial, variant))
            else:
                first[variant.name] = (trial, variant)
        try:
            if self.evaluator.parallel == 1:
                for trial, variant in first.values():
                    self._evaluate_one(trial, variant, prepared[variant.name], 0)
            else:
                futures = [self._gpus.submit(self._in_a_slot, trial, variant, prepared[variant.name])
                           for trial, variant in first.values()]
                for f in futures:
                    f.result()
        finally:  # every one told before the copies read them, an interrupted batch's too
            recorded, self._recording = self._recording, []
            concurrent.futures.wait(recorded)
        for f in recorded:  # a failed tell raises (here, not in place of the batch's own error)
            f.result()
        for trial, variant in copies:
            number, result = self.book.results[variant.name]
            self.book.tell(trial, variant, result, duplicate_of=number)

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
        self._recording.append(self._recorder.submit(self._record, trial, variant, build, result))

    def _record(self, trial, variant, build: dict, result: dict) -> None:
        with self._lock:  # the study, the book and the report are shared by the slots
            if build["status"] == "ok":
                self.report.evaluated += 1
            self.report.verify_s += result.get("verify_s", 0.0)
            self.report.time_s += result.get("time_s", 0.0)
            self.book.record(trial, variant, result, self.records_path)

    def _best_known(self) -> float | None:
        """The best finished value: the study's before this run, and every one told since."""
        known = [b for b in (self._prior_best, self.book.best) if b is not None]
        return min(known) if known else None

    def _probe(self, trial, partial: dict) -> bool:
        """The first repetitions' objective as the trial's intermediate value; go on unless the
        study's pruner says prune (or another searcher failed the trial meanwhile: `tell` drops it).
        A search that joins halves prunes only a variant behind in both halves: one with the best
        forward and a slow backward is the forward a joined variant takes."""
        import optuna

        for f in list(self._recording):  # the variants before it told (done by now, as a rule): the same
            f.result()                   # decision as when each was told before the next one ran
        try:
            trial.report(objective_value(partial, self.cfg.objective), partial["fwd"].get("reps", 0))
        except optuna.exceptions.UpdateFinishedTrialError:
            return False
        with self._lock:
            self.book.probed.add(trial.number)
            if self.joins:
                return not self.book.behind_in_both(partial, self.cfg.prune)
        return not trial.should_prune()


class _Piece:
    """A piece of a batch: its (trial, variant)s, compiling in `pool`; the builds come in `ready`
    as each translation unit ends, all of them in the future's result."""

    def __init__(self, part: list, pool, prepare):
        self.part = part
        self.ready: queue.Queue = queue.Queue()
        self.built = pool.submit(prepare, _unique(part), False, self.ready)

    def parts(self):
        """(trials, prepared) as builds come: the trials of the variants built so far, then the
        rest with the whole build's results. A variant's trials go together (one is evaluated,
        the others copy it)."""
        waiting: dict[str, list] = {}
        for trial, variant in self.part:
            waiting.setdefault(variant.name, []).append((trial, variant))
        while waiting:
            got: dict = {}
            try:
                got = self.ready.get(timeout=0.05)
                while True:  # and every unit that ended meanwhile: the GPUs take them side by side
                    got = {**got, **self.ready.get_nowait()}
            except queue.Empty:
                if not got and not self.built.done():
                    continue
                if not got:
                    got = self.built.result()  # the rest, failed builds among them (raises what the build raised)
                    missing = sorted(set(waiting) - set(got))
                    if missing:
                        raise RuntimeError(f"the build gave no result for {len(missing)} variant(s): {missing[:3]}")
            part = [tv for name in got if name in waiting for tv in waiting.pop(name)]
            if part:
                yield part, got


def _unique(batch) -> list[Variant]:
    return list({v.name: v for _, v in batch}.values())


def finished(cfg: SearchConfig) -> SearchReport | None:
    """The report of a study that already has its trials and its winner, read without starting
    CUDA, when the attached GPU (as nvidia-smi names it) is the one it was measured on; else None."""
    import optuna

    if cfg.simulate or cfg.plant_faults or cfg.import_records or cfg.gpu.lower() == "auto":
        return None
    name = cfg.study_name(cfg.gpu)
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


def make_evaluator(cfg: SearchConfig) -> Evaluator:
    """What evaluates the search's variants: a replay of a recording, or the GPUs' workers."""
    if cfg.simulate:
        simulated = 1 if cfg.devices in (None, "all") else len(gpus.device_indices(cfg.devices))
        return SimulatedEvaluator(cfg.simulate, cfg.problem, cfg.objective, cfg.gpu, cfg.simulate_delay,
                                  devices=simulated)
    paths.studies_dir().mkdir(parents=True, exist_ok=True)
    return LiveEvaluator(cfg.gpu, cfg.problem, cfg.objective, arch=cfg.arch, jobs=cfg.jobs,
                         eval_timeout=cfg.eval_timeout, log_path=paths.worker_log(),
                         devices=gpus.device_indices(cfg.devices))


def run(cfg: SearchConfig) -> SearchReport:
    started = time.monotonic()
    one_blas_thread()  # before Optuna loads numpy: the ranker's fits share the cores with the compilers
    report = finished(cfg)
    if report is not None:
        report.wall_s = time.monotonic() - started
        return report
    evaluator = make_evaluator(cfg)
    try:
        return Search(cfg, evaluator).run()
    finally:
        evaluator.close()
