"""The end of a search: its best few variants timed again, in turns and with more repetitions
(the close ones once more among themselves: `worker.Child.retime`), and the winner picked on
those timings rather than on the search's single measurement of each.

A family whose search builds and checks only what its problem runs (`FINALISTS_WHOLE`: an
EmbeddingBag search has its problem's mode alone) has its finalists built whole, as the export
builds them, and checked in full before they are timed: one that fails is rejected (kept in the
study's `rejected`, never the winner) and the next best takes its place. The best few so far are
built whole while the last batch is evaluated (`Search._likely_finalists`), so that most of these
builds are found done."""

from __future__ import annotations

import sys

from tuner import families
from tuner import study as studies
from tuner.records import objective_value
from tuner.search.config import SearchConfig, SearchReport


def retime(cfg: SearchConfig, study, space, evaluator, prepare, report: SearchReport) -> None:
    """`prepare(variants, whole)` builds (or finds built) what the evaluator times."""
    frame = studies.trials_frame(study, space)
    if frame.empty or not (frame["state"] == "COMPLETE").any():
        return
    whole = bool(getattr(families.get(space.family), "FINALISTS_WHOLE", False))
    rejected: dict[str, str] = dict(study.user_attrs.get("rejected", {}))
    by_name = space.by_name()
    ranked = [by_name[name] for name in studies.top(frame, len(frame))["variant"] if name in by_name]
    rows: list[dict] = []
    while True:  # until a finalist passes, or none is left (one round without a check: no re-round)
        variants = [v for v in ranked if v.name not in rejected][:cfg.top_k]
        if not variants:
            break
        before = len(rejected)
        timings = evaluator.retime(variants, prepare(variants, whole), cfg.objective, whole=whole)
        for v in variants:
            t = timings.get(v.name)
            if t is None:
                continue
            if "failed" in t:
                rejected[v.name] = t["failed"]
                print(f"{report.study_name}: finalist {v.name} rejected by its whole check: {t['failed'][:300]}",
                      file=sys.stderr)
                continue
            rows.append({"variant": v.name, "params": space.tuned(v), **t,
                         "objective_us": objective_value(t, cfg.objective)})
        if rows or len(rejected) == before:
            break
    if rejected:
        study.set_user_attr("rejected", rejected)
    rows.sort(key=lambda r: r["objective_us"])
    if rows:
        report.retimed = rows
        report.winner = rows[0]
        study.set_user_attr("retimed", rows)
        study.set_user_attr("winner", rows[0])
