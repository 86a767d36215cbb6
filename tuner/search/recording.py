"""The search's book of the study: what it has seen, what finished (each variant's outcome),
and the one place trials are told and measurements logged."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from tuner.store import records
from tuner.store import searchers
from tuner.store import study as studies
from tuner.store.records import objective_value
from tuner.search.config import SearchConfig, SearchReport


class Book:
    def __init__(self, cfg: SearchConfig, study, space, dists: dict, gpu: Callable[[], dict],
                 report: SearchReport):
        """`gpu()` describes the GPU (waiting for it to start, where it has not): read once, when the
        first measurement is recorded."""
        self.cfg, self.study, self.space, self.dists = cfg, study, space, dists
        self._gpu = gpu
        self._gpu_info: dict | None = None
        self.report = report
        self.results: dict[str, tuple[int, dict]] = {}  # variant -> (trial number, outcome)
        self.seen: set[str] = set()  # variants the study has, in any state, as last read
        self.waiting = 0  # queued trials in the study (retries, planted faults), as last read
        self.best: float | None = None
        self.stopped = False  # stop_when said so
        self.probed: set[int] = set()  # trials that reported a probe
        self.bar = None  # a tqdm progress bar, when shown

    def record_identity(self, family: str, gpu_name: str | None) -> None:
        """What the study measures; `gpu_name`, where known before the GPU starts, must be the one
        its earlier trials were measured on (else that is checked once the GPU has started)."""
        attrs = self.study.user_attrs
        identity = {"family": family, "problem": self.cfg.problem.__dict__, "objective": self.cfg.objective}
        for key, value in identity.items():
            if key not in attrs:
                self.study.set_user_attr(key, value)
        if gpu_name is not None:
            self._check_gpu(gpu_name)

    def _check_gpu(self, name: str | None) -> None:
        known = self.study.user_attrs.get("gpu", {}).get("gpu_name")
        if known and known != name:
            from tuner.errors import GpuError

            raise GpuError(f"study {self.study.study_name!r} was measured on {known}, not on {name}; "
                           "pass another --study name")

    @property
    def gpu_info(self) -> dict:
        if self._gpu_info is None:
            info = self._gpu()
            self._check_gpu(info.get("gpu_name"))
            if "gpu" not in self.study.user_attrs:
                self.study.set_user_attr("gpu", info)
            self._gpu_info = info
        return self._gpu_info

    # ------------------------------------------------------------ telling

    def tell(self, trial, variant, result: dict, duplicate_of: int | None = None) -> bool:
        """Tell the study; False when another searcher failed the trial meanwhile (this one was cut
        off from the study for too long): it was queued again, and runs again from there."""
        import optuna

        attrs = result_attrs(result)
        if duplicate_of is not None:
            attrs["result"]["duplicate_of"] = duplicate_of
        value = objective_value(result, self.cfg.objective) if result["status"] == "ok" else None
        state = {"ok": "COMPLETE", "pruned": "PRUNED"}.get(result["status"], "FAIL")
        try:
            set_user_attrs(trial, attrs)
            if state == "PRUNED" and trial.number not in self.probed:  # a copied outcome: what was measured then
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
            self.best = value if self.best is None else min(self.best, value)
            self.stopped = self.stopped or bool(self.cfg.stop_when and self.cfg.stop_when(self.best))
        self.report.trials += 1
        if self.bar is not None:
            self.bar.update(1)
            if self.best is not None:
                self.bar.set_postfix_str(f"best {self.best:.2f} us")
        return True

    def record(self, trial, variant, result: dict, records_path: Path) -> None:
        """A measured variant: the study first, then the log. A searcher killed before its result
        landed leaves the trial running, to be failed and run again, and no record of a
        measurement the study never got."""
        if not self.tell(trial, variant, result):
            return
        self.results[variant.name] = (trial.number, result)
        records.append(records_path, {
            "study": self.study.study_name, "gpu": self.gpu_info, "problem": self.cfg.problem.key(),
            "objective": self.cfg.objective, "variant": variant.name, "params": self.space.tuned(variant),
            **{k: v for k, v in result.items() if k not in ("so",)}, "at": time.time(),
        })

    # ------------------------------------------------------------ reading

    @staticmethod
    def copy(prior) -> dict:
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

    def refresh(self) -> dict[str, int]:
        """Read the study once: finished outcomes into the book; running trials by variant."""
        running: dict[str, int] = {}
        for t in self.study.get_trials(deepcopy=False):
            name = t.user_attrs.get("variant")
            if t.state.name == "WAITING":  # named as `Asker.ask` will name it
                queued = self.space.nearest(t.params)
                fault = t.user_attrs.get("fault")
                self.seen.add((queued.replace(fault=fault) if fault else queued).name)
            if name is None:
                continue
            self.seen.add(name)
            if t.state.name == "RUNNING":
                running[name] = min(running.get(name, t.number), t.number)
            elif name not in self.results and (t.state.name in ("COMPLETE", "PRUNED") or (
                    t.state.name == "FAIL" and not studies.interrupted(t))):
                self.results[name] = (t.number, self.copy(t))
        return running

    def settle_known(self, batch):
        """Tell the trials whose variant the study already measured; return (new, still running
        elsewhere: the run loop waits for those)."""
        running = self.refresh()
        new, waiting = [], []
        for trial, variant in batch:
            if variant.name in self.results:
                number, result = self.results[variant.name]
                self.tell(trial, variant, result, duplicate_of=number)
            elif running.get(variant.name, trial.number) < trial.number:
                waiting.append((trial, variant))  # an earlier trial evaluates it now
            else:
                new.append((trial, variant))
        return new, waiting

    def outcomes(self, objective: str | None = None) -> dict[str, float | None]:
        """Each finished variant's objective (a pruned one's probe), None for a failure; with
        `objective` ("fwd", "bwd"), that time instead of the search's."""
        out: dict[str, float | None] = {}
        for name, (_, result) in self.results.items():
            ok = result.get("status") in ("ok", "pruned") and "fwd" in result
            out[name] = objective_value(result, objective or self.cfg.objective) if ok else None
        return out

    def behind_in_both(self, partial: dict, factor: float) -> bool:
        """A probe over `factor` x the best finished forward and over it x the best backward: a
        variant no join could use either half of (a half no finished variant has yet: not behind)."""
        done = [r for _, r in self.results.values() if r.get("status") == "ok"]
        for half in ("fwd", "bwd"):
            best = min((objective_value(r, half) for r in done), default=0.0)
            if not best > 0 or objective_value(partial, half) <= factor * best:
                return False
        return True

    # ------------------------------------------------------------ adding

    def import_records(self, path: Path) -> int:
        """Add measurements from a log (another run's, or a recording) as finished trials, so the
        search does not evaluate those variants again. Only records of this problem and GPU count."""
        import optuna

        known = {t.user_attrs.get("variant") for t in self.study.get_trials(deepcopy=False)}
        by_name = self.space.by_name()
        gpu = self.gpu_info.get("gpu_name")
        added = 0
        for rec in records.read_some(Path(path), "--import-records"):
            v = by_name.get(rec.get("variant")) if isinstance(rec.get("variant"), str) else None
            recorded_on = rec.get("gpu") if isinstance(rec.get("gpu"), dict) else {}
            if (v is None or v.name in known or rec.get("problem") != self.cfg.problem.key()
                    or recorded_on.get("gpu_name") != gpu or rec.get("objective") != self.cfg.objective):
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

    def plant(self, faults, known_faults) -> None:
        """Queue one variant per planted fault (once per study), ahead of the sampler's picks."""
        known = {t.user_attrs.get("fault") for t in self.study.get_trials(deepcopy=False)}
        base = self.space.tuned(next(iter(self.space)))
        for fault in faults:
            if fault not in known_faults:
                from tuner.errors import UsageError

                raise UsageError(f"unknown fault {fault!r}; known: {', '.join(known_faults)}")
            if fault not in known:
                self.study.enqueue_trial(base, user_attrs={"fault": fault, "owner": searchers.owner()})


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


def set_user_attrs(trial, attrs: dict) -> None:
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
