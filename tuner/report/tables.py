"""The tables of `tuner report` (tuner/report/report.py): what a study's trials say, per dimension, with
a header naming the study, the GPU, the objective and the trials left out (`About`)."""

from __future__ import annotations

import numbers
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

OBJECTIVES = {"fwd": "forward time", "bwd": "backward time", "fwd+bwd": "forward + backward time"}


@dataclass
class About:
    """What a reader of any one file needs to know: which study, GPU and objective, and how many
    trials are behind it."""
    study: str
    gpu: str
    objective: str  # fwd, bwd or fwd+bwd
    verified: int = 0
    pruned: int = 0
    failed: int = 0
    planted: int = 0  # planted-fault variants that passed (test only): never counted as verified
    unfinished: int = 0  # running or waiting when the report was made
    reasons: dict[str, int] = field(default_factory=dict)  # failures by reason

    @property
    def axis(self) -> str:
        """The objective as an axis label, with its unit."""
        return f"{self.objective} time (µs)"

    def objective_line(self) -> str:
        return f"objective {self.objective}: {OBJECTIVES.get(self.objective, self.objective)}, median (µs)"

    def counts(self) -> str:
        text = f"{self.verified} verified, {self.pruned} pruned, {self.failed} failed"
        if self.planted:
            text += f", {self.planted} planted faults"
        if self.unfinished:
            text += f", {self.unfinished} unfinished"
        return text

    def header(self) -> str:
        """One line naming everything, for the top of a table."""
        return f"{self.study} · GPU {self.gpu} · {self.objective_line()} · trials: {self.counts()}"


def verified(frame):
    """Trials that finished, passed verification and were timed in full; planted-fault variants
    never count, even if they passed."""
    if frame.empty:  # a study with no trial yet has no columns either
        return frame
    return frame[(frame["state"] == "COMPLETE") & (frame["fault"] == "")]


def describe(st, frame) -> About:
    gpu = st.user_attrs.get("gpu") or {}
    if isinstance(gpu, dict):
        name = gpu.get("gpu_name") or gpu.get("arch") or "unknown GPU"
        notes = [gpu["arch"]] if gpu.get("arch") and gpu.get("arch") != name else []
        if gpu.get("simulated_from"):  # a replay must never read as a measurement
            notes.append(f"replayed from {Path(gpu['simulated_from']).name}")
        name += f" ({', '.join(notes)})" if notes else ""
    else:
        name = str(gpu)
    if frame.empty:
        return About(study=st.study_name, gpu=name, objective=st.user_attrs.get("objective", "fwd+bwd"))
    state, fault = frame["state"], frame["fault"]
    failed = frame[state == "FAIL"]
    return About(study=st.study_name, gpu=name, objective=st.user_attrs.get("objective", "fwd+bwd"),
                 verified=len(verified(frame)), pruned=int((state == "PRUNED").sum()), failed=len(failed),
                 planted=int(((state == "COMPLETE") & (fault != "")).sum()),
                 unfinished=int(state.isin(["RUNNING", "WAITING"]).sum()),
                 reasons=dict(Counter(r or "no reason" for r in failed["reason"])))


def ordered(values, order=()) -> list:
    """`values` in the space's order (`Dim.values`), then any the space no longer has: numbers in
    numeric order, the rest as text (sorting all as text puts 1024 before 128)."""
    values = list(values)
    known = [v for v in order if v in values]
    rest = [v for v in values if v not in known]
    return known + sorted(rest, key=lambda v: (0, v, "") if _number(v) else (1, 0, str(v)))


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)  # numpy's scalars count too


def occupancy(regs: float | None, block: int | None, regs_per_sm: int = 65536, threads_per_sm: int = 2048,
              blocks_per_sm: int = 32) -> float | None:
    """Theoretical occupancy (resident warps / the SM's maximum) as registers and block size allow
    it (shared memory aside; sm_80/sm_90 limits, registers allocated per warp in units of 256)."""
    if regs is None or block is None or regs != regs or not regs:
        return None
    warps = -(-int(block) // 32)
    per_warp = -(-int(regs) * 32 // 256) * 256
    blocks = min(regs_per_sm // (per_warp * warps), threads_per_sm // (warps * 32), blocks_per_sm)
    return blocks * warps * 32 / threads_per_sm


def by_dimension(frame, dims: list[str], order: dict | None = None):
    """Per value of each dimension (in the space's order): its verified, pruned and failed trials;
    over the verified ones the best objective and forward time, and that best trial's registers,
    spills and theoretical occupancy (the forward kernel's), so that a finding such as "hoisting
    the bounds check frees registers and raises occupancy" can be read off a study."""
    import pandas as pd

    done = verified(frame)
    rows = []
    for dim in dims:
        for value in ordered(frame[dim].dropna().unique(), (order or {}).get(dim, ())):
            mine = frame[dim] == value
            part = done[done[dim] == value]
            row = {"dimension": dim, "value": value, "trials": len(part),
                   "pruned": int((mine & (frame["state"] == "PRUNED")).sum()),
                   "failed": int((mine & (frame["state"] == "FAIL")).sum()),
                   "best_objective_us": None, "best_fwd_us": None, "regs_fwd": None,
                   "median_regs_fwd": None, "spill_bytes": None, "occupancy": None}
            if len(part):
                best = part.loc[part["objective_us"].idxmin()]
                regs = best.get("regs_fwd")
                regs = None if regs is None or regs != regs else int(regs)
                row.update(best_objective_us=round(float(best["objective_us"]), 2),
                           best_fwd_us=_round(best.get("fwd_us")), regs_fwd=regs,
                           median_regs_fwd=_round(part["regs_fwd"].median(), 1),
                           spill_bytes=int(_round(best.get("spill_bytes"), 0) or 0),
                           occupancy=occupancy(regs, best.get("block_size")))
            rows.append(row)
    table = pd.DataFrame(rows)
    for col in ("regs_fwd", "spill_bytes"):  # whole numbers, even beside values with no verified trial
        table[col] = table[col].astype("Int64")
    return table


def _round(v, digits: int = 2):
    return None if v is None or v != v else round(float(v), digits)


def markdown(table, about: About | None = None) -> str:
    """The table in Markdown, under a heading and the line that names the study (`about`)."""
    import pandas as pd

    lines = []
    if about is not None:
        lines += [f"# {about.study}: by dimension", "", about.header(), "",
                  "Per value, in the space's order: trials = verified trials, then pruned and failed "
                  "ones; best = the fastest verified trial (µs); its forward kernel's registers per "
                  "thread, spilled bytes and theoretical occupancy; median_regs_fwd over the verified "
                  "trials; - where no trial of that value was verified.", ""]
    cols = list(table.columns)
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            cells.append("-" if pd.isna(v) else (f"{v:.0%}" if c == "occupancy" else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


FILES = {
    "trials.csv": "every trial, one row each: state (COMPLETE, PRUNED, FAIL), the variant's values, "
                  "times (µs; a pruned trial's are its probe's), registers, spills, failure reason",
    "importance.json": "how much each dimension explains the objective (Optuna's PED-ANOVA; "
                       "empty with fewer than 2 verified trials)",
    "by_dimension.csv": "per value of each dimension: verified, pruned and failed trials, the best "
                        "verified time, its registers, spills and occupancy",
    "by_dimension.md": "the same table in Markdown, under a line naming the study, GPU, objective "
                       "and counts",
    "time_by_dimension.png": "the objective per value of each dimension: boxes of the verified "
                             "trials (n per value), pruned trials at their probe time",
    "time_vs_registers.png": "the objective against each kernel's registers per thread",
}


def index(about: About, written: list[str], importance: dict) -> str:
    """README.txt: what the folder holds, for whoever opens it without the command line."""
    lines = [f"Report of study {about.study}", f"GPU: {about.gpu}", about.objective_line(),
             f"trials: {about.counts()}"]
    if about.reasons:
        lines.append("failures by reason: " + ", ".join(f"{r} {n}" for r, n in sorted(about.reasons.items())))
    if importance:
        lines.append("most important dimensions: " + ", ".join(f"{k} {v:.2f}" for k, v in list(importance.items())[:3]))
    lines += ["", "files:"] + [f"  {name:<22} {FILES.get(name, '')}" for name in written]
    if not about.verified:
        lines.append("  (no verified trial: no table or plots)")
    return "\n".join(lines) + "\n"
