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
        _plots(done, [d.name for d in space.dims], out)
    return importance


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
