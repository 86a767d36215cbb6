"""The end of a search: its best few variants timed again, in turns and with more repetitions
(the close ones once more among themselves: `worker.Child.retime`), and the winner picked on
those timings rather than on the search's single measurement of each.

A family whose search builds and checks only what its problem runs (`FINALISTS_WHOLE`: an
EmbeddingBag search has its problem's mode alone) has its finalists built whole, as the export
builds them, and checked in full before they are timed: one that fails is rejected (kept in the
study's `rejected`, never the winner) and the next best takes its place. The best few so far are
built whole while the last batch is evaluated (`Search._likely_finalists`), so that most of these
builds are found done.

A family with a `JOINED_TEMPLATE` (forward and backward of different variants in one table) also
has the few best forwards and best backwards of its trials among the finalists. Where the best
re-timed forward and backward are two variants whose times add up to clearly less than the
winner's, they are joined (`Variant.joined`), is built, checked in full and re-timed beside the winner;
it wins when it is faster there. An EmbeddingBag search of 16-bit weights needs this: its sorted
backward decides the sum and wants a mapping that makes the forward half as fast as it can be."""

from __future__ import annotations

import sys

from tuner import families
from tuner import study as studies
from tuner.records import objective_value
from tuner.search.config import SearchConfig, SearchReport
from tuner.variant import Variant

HALVES = 2  # the best forwards and the best backwards of the trials that join the finalists (families that join)
JOIN_GAIN = 0.02  # a joined variant is tried when its halves' times add up to this much less than the winner's


def retime(cfg: SearchConfig, study, space, evaluator, prepare, report: SearchReport) -> None:
    """`prepare(variants, whole)` builds (or finds built) what the evaluator times."""
    frame = studies.trials_frame(study, space)
    if frame.empty or not (frame["state"] == "COMPLETE").any():
        return
    whole = bool(getattr(families.get(space.family), "FINALISTS_WHOLE", False))
    rejected: dict[str, str] = dict(study.user_attrs.get("rejected", {}))
    by_name = space.by_name()
    done = studies.top(frame, len(frame))
    ranked = [by_name[name] for name in done["variant"] if name in by_name]
    joins = cfg.objective == "fwd+bwd" and getattr(families.get(space.family), "JOINED_TEMPLATE", None) is not None
    halves = []  # the best forwards and backwards (each ranked without its other half)
    if joins:
        for column in ("fwd_us", "bwd_us"):
            halves += [by_name[n] for n in done.sort_values(column)["variant"].head(HALVES) if n in by_name]
    rows: list[dict] = []
    while True:  # until a finalist passes, or none is left (one round without a check: no re-round)
        variants = [v for v in ranked if v.name not in rejected][:cfg.top_k]
        variants += [v for v in dict.fromkeys(halves) if v.name not in rejected and v not in variants]
        if not variants:
            break
        before = len(rejected)
        timings = evaluator.retime(variants, prepare(variants, whole), cfg.objective, whole=whole)
        for v in variants:
            t = timings.get(v.name)
            if t is None:
                continue
            if "failed" in t:
                _reject(v, t["failed"], rejected, report)
                continue
            rows.append({"variant": v.name, "params": space.tuned(v), **t,
                         "objective_us": objective_value(t, cfg.objective)})
        if rows or len(rejected) == before:
            break
    rows.sort(key=lambda r: r["objective_us"])
    if rows and joins:
        rows = _joined(cfg, space, evaluator, prepare, rows, rejected, report)
    if rejected:
        study.set_user_attr("rejected", rejected)
    if rows:
        report.retimed = rows
        report.winner = rows[0]
        study.set_user_attr("retimed", rows)
        study.set_user_attr("winner", rows[0])


def _reject(v: Variant, why: str, rejected: dict[str, str], report: SearchReport) -> None:
    rejected[v.name] = why
    print(f"{report.study_name}: finalist {v.name} rejected by its whole check: {why[:300]}", file=sys.stderr)


def _joined(cfg: SearchConfig, space, evaluator, prepare, rows: list[dict], rejected: dict[str, str],
          report: SearchReport) -> list[dict]:
    """The re-timed rows, with the best forward joined to the best backward first when it
    is checked and faster than the winner beside it (the winner's row timed again with it)."""
    fwd = min(rows, key=lambda r: r["fwd"]["median_us"])
    bwd = min(rows, key=lambda r: r["bwd"]["median_us"])
    if fwd is bwd or fwd["fwd"]["median_us"] + bwd["bwd"]["median_us"] > rows[0]["objective_us"] * (1 - JOIN_GAIN):
        return rows
    by_name = space.by_name()
    joined, winner = Variant.joined(by_name[fwd["variant"]], by_name[bwd["variant"]]), by_name[rows[0]["variant"]]
    # always checked in full: a joined variant is a new binary, never evaluated in the search
    timings = evaluator.retime([joined, winner], prepare([joined, winner], True), cfg.objective, whole=True)
    t, mine = timings.get(joined.name), timings.get(winner.name)
    if t is None or mine is None or "failed" in mine:
        return rows
    if "failed" in t:
        _reject(joined, t["failed"], rejected, report)
        return rows
    ours, theirs = objective_value(t, cfg.objective), objective_value(mine, cfg.objective)
    print(f"{report.study_name}: joined {joined.name}: {ours:.2f} us vs the winner's {theirs:.2f} us timed beside it",
          file=sys.stderr)
    if ours >= theirs:
        return rows
    row = {"variant": joined.name, "params": joined.as_dict(), **t, "objective_us": ours,
           "halves": {"forward": fwd["variant"], "backward": bwd["variant"]}}
    return [row, {**rows[0], **mine, "objective_us": theirs}] + rows[1:]
