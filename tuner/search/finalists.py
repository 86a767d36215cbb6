"""The end of a search: its best few variants timed again, in turns and with more repetitions
(the close ones once more among themselves: `worker.Child.retime`), and the winner picked on
those timings rather than on the search's single measurement of each."""

from __future__ import annotations

from tuner import study as studies
from tuner.records import objective_value
from tuner.search.config import SearchConfig, SearchReport


def retime(cfg: SearchConfig, study, space, evaluator, prepare, report: SearchReport) -> None:
    """`prepare(variants)` builds (or finds built) what the evaluator times."""
    frame = studies.trials_frame(study, space)
    if frame.empty or not (frame["state"] == "COMPLETE").any():
        return
    best = studies.top(frame, cfg.top_k)
    by_name = {v.name: v for v in space}
    variants = [by_name[name] for name in best["variant"] if name in by_name]
    timings = evaluator.retime(variants, prepare(variants), cfg.objective)
    rows = []
    for v in variants:
        t = timings.get(v.name)
        if t is None:
            continue
        rows.append({"variant": v.name, "params": space.tuned(v), **t,
                     "objective_us": objective_value(t, cfg.objective)})
    rows.sort(key=lambda r: r["objective_us"])
    if rows:
        report.retimed = rows
        report.winner = rows[0]
        study.set_user_attr("retimed", rows)
        study.set_user_attr("winner", rows[0])
