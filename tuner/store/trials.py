"""A study's trials read as rows: the tables `show`, `report` and the export read (a pandas
DataFrame), and the search's end's ranking without one."""

from __future__ import annotations

from tuner.store.study import facts


COLUMNS = ["number", "state", "objective_us", "fwd_us", "fwd_spread_us", "bwd_us", "bwd_spread_us",
           "regs_fwd", "regs_bwd", "spill_bytes", "reason"]


def trials_frame(study, space):
    """All trials as a pandas DataFrame: the variant's parameters (what ran, which may be the
    repair of what the sampler proposed), timings, registers, reason."""
    import pandas as pd

    dims = [d.name for d in space.dims]
    by_name = space.by_name()
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = facts(t)
        variant = _text(a.get("variant"))
        rows.append({
            "number": t.number, "state": t.state.name, "variant": variant,
            **(space.tuned(by_name[variant]) if variant in by_name else {d: t.params.get(d) for d in dims}),
            "objective_us": t.value if t.value is not None else float("nan"),
            **{k: _number(a.get(k)) for k in NUMBERS},
            "reason": _text(a.get("reason")), "duplicate_of": _number(a.get("duplicate_of")),
            "fault": _text(a.get("fault")),
        })
    return pd.DataFrame(rows)


# A trial's recorded numbers and words as the tables read them: a value of another type (a journal
# edited by hand, another tool's attribute of the same name) reads as missing, not as a crash.
NUMBERS = ("fwd_us", "fwd_spread_us", "bwd_us", "bwd_spread_us", "regs_fwd", "regs_bwd", "spill_bytes", "compile_s")


def _number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _text(v) -> str:
    return v if isinstance(v, str) else ""


def fastest(study) -> list[dict]:
    """`top` of every verified variant without a table (the search's end reads it, where importing
    pandas cost 0.2-0.4 s): {"variant", "objective_us", "fwd_us", "bwd_us"} each, fastest first; a
    variant's first trial only, planted faults never."""
    import optuna

    rows, seen = [], set()
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    for t in sorted(done, key=lambda t: t.number):  # a variant's first trial, as `top` keeps it
        a = facts(t)
        variant = _text(a.get("variant"))
        if _text(a.get("fault")) or variant in seen or t.value is None:
            continue
        seen.add(variant)
        rows.append({"variant": variant, "objective_us": t.value,
                     **{k: _number(a.get(k)) for k in ("fwd_us", "bwd_us")}})
    return sorted(rows, key=lambda r: r["objective_us"])


def top(frame, k: int = 5):
    """The k fastest verified variants; planted-fault variants never count, even if they passed."""
    if frame.empty:  # a study without a trial (a search stopped at once): no columns either
        return frame
    done = frame[(frame["state"] == "COMPLETE") & (frame["fault"] == "")].drop_duplicates("variant")
    return done.sort_values("objective_us").head(k)
