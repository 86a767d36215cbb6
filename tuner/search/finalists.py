"""The end of a search: its best few variants timed again, in turns and with more repetitions
(the close ones once more among themselves: `tuner.measure.child.Child.retime`), and the winner picked on
those timings rather than on the search's single measurement of each. The family's baseline,
the torch op it replaces, is timed in the same turns: the export serves the problem with it
where the winner does not beat it (`records.served_by`).

A search that checked its variants at smaller sizes than its problem's (a family's `CHECK_SIZES`,
tuner.measure.cases.sized) checks its finalists at the problem's own sizes before they are timed. A
family whose search builds and checks only what its problem runs (`FINALISTS_WHOLE`: a search builds
only its problem's mode of an op with several) has its finalists built whole, as the export builds
them, and checked in full before they are timed. A finalist that fails its check is rejected (kept
in the study's `rejected`, never the winner) and the next best takes its place. The best few so far are
built whole while the last batch is evaluated (`Search._likely_finalists`), so that most of these
builds are found done.

A family with a `JOINED_TEMPLATE` (a table with the forward of one variant and the backward of
another) also has, where the search's best forward and best backward are two variants whose times
add up to clearly less than its best variant's, the two joined (`Variant.joined`) among its
finalists: built whole, ahead with the others, checked in full and re-timed with them, the
winner if it is the fastest there: where a backward that decides the sum wants a parameter that
makes the forward slower, no single variant is the fastest of both."""

from __future__ import annotations

import sys

from tuner import families
from tuner.measure import cases
from tuner.store import trials
from tuner.store import records
from tuner.store.records import BASELINE, BASELINE_EXTRA, objective_value
from tuner.search.config import SearchConfig, SearchReport
from tuner.variant import Variant

JOIN_GAIN = 0.02  # the halves' times add up to at least this much less than the best variant's


def joins(cfg: SearchConfig, space) -> bool:
    return cfg.objective == "fwd+bwd" and getattr(families.get(space.family), "JOINED_TEMPLATE", None) is not None


def joined(by_name: dict[str, Variant], measured: dict[str, tuple[float, float]]) -> Variant | None:
    """The best forward joined to the best backward by the search's measurements (variant name ->
    (fwd, bwd) µs), where they are two variants whose times add up to JOIN_GAIN less than the best
    variant's; else None."""
    if not measured:
        return None
    fwd, bwd = (min(measured, key=lambda n: measured[n][i]) for i in (0, 1))
    if fwd == bwd or measured[fwd][0] + measured[bwd][1] > min(map(sum, measured.values())) * (1 - JOIN_GAIN):
        return None
    return Variant.joined(by_name[fwd], by_name[bwd])


def retime(cfg: SearchConfig, study, space, evaluator, prepare, report: SearchReport) -> None:
    """`prepare(variants, whole)` builds (or finds built) what the evaluator times."""
    done = trials.fastest(study)
    if not done:
        return
    join = joins(cfg, space)
    family = families.get(space.family)
    # a joined variant is a new binary, never checked in the search: it is checked whole
    whole = join or bool(getattr(family, "FINALISTS_WHOLE", False))
    # a search that checked its variants at smaller sizes (`cases.sized`) checks its finalists at its own
    checked = whole or cases.sized(family, cfg.problem.__dict__) != cfg.problem.__dict__
    rejected: dict[str, str] = dict(study.user_attrs.get("rejected", {}))
    by_name = space.by_name()
    ranked = [by_name[r["variant"]] for r in done if r["variant"] in by_name]
    measured = {r["variant"]: (r["fwd_us"], r["bwd_us"]) for r in done
                if r["variant"] in by_name and all(t is not None and t == t for t in (r["fwd_us"], r["bwd_us"]))}  # not NaN
    extra = joined(by_name, measured) if join else None
    rows: list[dict] = []
    baseline = None  # the torch op's timings in the same turns as the finalists
    while True:  # until a finalist passes, or none is left (one round without a check: no re-round)
        variants = [v for v in ranked if v.name not in rejected][:cfg.top_k]
        variants += [extra] if extra is not None and extra.name not in rejected else []
        if not variants:
            break
        before = len(rejected)
        timings = evaluator.retime(variants, prepare(variants, whole), cfg.objective, whole=whole, baseline=True,
                                   check=checked)
        if BASELINE in timings:
            baseline = timings.pop(BASELINE)
            if BASELINE_EXTRA in timings:
                baseline["variant_extra"] = timings.pop(BASELINE_EXTRA)["bwd"]
        for v in variants:
            t = timings.get(v.name)
            if t is None:
                continue
            if "failed" in t:
                _reject(v, t["failed"], rejected, report)
                continue
            halves = v.halves()
            rows.append({"variant": v.name, "params": space.tuned(v) if halves is None else v.as_dict(), **t,
                         "objective_us": objective_value(t, cfg.objective),
                         **({"halves": {"forward": halves[0].name, "backward": halves[1].name}} if halves else {})})
        if rows or len(rejected) == before:
            break
    if rejected:
        study.set_user_attr("rejected", rejected)
    if baseline is not None:
        # what the export compares the winner with (records.served_by); replayed by --simulate
        study.set_user_attr("baseline", baseline)
        report.baseline = baseline
        records.append(report.records_path, {"problem": cfg.problem.key(), "baseline": baseline,
                                             "gpu": evaluator.gpu_info})
    rows.sort(key=lambda r: r["objective_us"])
    if rows:
        report.retimed = rows
        report.winner = rows[0]
        study.set_user_attr("retimed", rows)
        study.set_user_attr("winner", rows[0])


def _reject(v: Variant, why: str, rejected: dict[str, str], report: SearchReport) -> None:
    rejected[v.name] = why
    print(f"{report.study_name}: finalist {v.name} rejected by its whole check: {why[:300]}", file=sys.stderr)
