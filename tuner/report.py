"""`tuner report`: what a study says about the space, as a CSV, importances and plots."""

from __future__ import annotations

import json
from pathlib import Path

from tuner import study as studies


def report(st, out: Path) -> dict:
    """Write trials.csv, importance.json and plots (PNG) of a study into `out`; returns the importances."""
    import optuna

    problem = st.user_attrs.get("problem", {})
    space = studies.family_of(st).space_for(problem)
    frame = studies.trials_frame(st, space)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "trials.csv", index=False)
    done = frame[(frame["state"] == "COMPLETE") & (frame["fault"] == "")]
    importance: dict[str, float] = {}
    if len(done) >= 2:
        # PED-ANOVA needs no extra packages (fANOVA would need scikit-learn).
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        importance = optuna.importance.get_param_importances(st, evaluator=evaluator)
    (out / "importance.json").write_text(json.dumps(importance, indent=1))
    if not done.empty:
        dims = [d.name for d in space.dims]
        table = by_dimension(done, dims)
        table.to_csv(out / "by_dimension.csv", index=False)
        (out / "by_dimension.md").write_text(markdown(table))
        _plots(done, dims, out)
    return importance


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


def by_dimension(done, dims: list[str]):
    """Per value of each dimension, over its verified trials: how many, the best objective and
    forward time, and that best trial's registers, spills and theoretical occupancy (the forward
    kernel's), so that a finding such as "hoisting the bounds check frees registers and raises
    occupancy" can be read off a study."""
    import pandas as pd

    rows = []
    for dim in dims:
        for value in sorted(done[dim].dropna().unique(), key=str):
            part = done[done[dim] == value]
            best = part.loc[part["objective_us"].idxmin()]
            block = best.get("block_size") if "block_size" in part else None
            regs = best.get("regs_fwd")
            rows.append({"dimension": dim, "value": value, "trials": len(part),
                         "best_objective_us": round(float(best["objective_us"]), 2),
                         "best_fwd_us": round(float(best["fwd_us"]), 2) if "fwd_us" in part else None,
                         "regs_fwd": None if regs is None or regs != regs else int(regs),
                         "median_regs_fwd": float(part["regs_fwd"].median()) if "regs_fwd" in part else None,
                         "spill_bytes": int(best.get("spill_bytes") or 0),
                         "occupancy": occupancy(regs, block)})
    return pd.DataFrame(rows)


def markdown(table) -> str:
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in table.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            cells.append("-" if v is None or v != v else (f"{v:.0%}" if c == "occupancy" else str(v)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plots(done, dims: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = (len(dims) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows), squeeze=False)
    for ax, dim in zip(axes.flat, dims):
        values = sorted(done[dim].dropna().unique())
        groups = [done.loc[done[dim] == v, "objective_us"].values for v in values]
        ax.boxplot(groups, showfliers=False)
        ax.set_xticks(range(1, len(values) + 1), [str(v) for v in values], rotation=20, fontsize=8)
        ax.set_title(dim)
        ax.set_ylabel("objective (µs)")
    for ax in list(axes.flat)[len(dims):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out / "time_by_dimension.png", dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, col in zip(axes, ("regs_fwd", "regs_bwd")):
        part = done.dropna(subset=[col])
        ax.scatter(part[col], part["objective_us"], s=10, alpha=0.6)
        ax.set_xlabel(f"registers per thread ({col.split('_')[1]} kernel)")
        ax.set_ylabel("objective (µs)")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "time_vs_registers.png", dpi=100)
    plt.close(fig)
