"""The plots of `tuner report`: the objective per value of each dimension, and against registers.

Each builder returns a matplotlib Figure (made without pyplot, so no GUI backend is ever chosen
and nothing global changes) that `write` saves; tests read titles and ticks off the Figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tuner.report.tables import About, ordered, verified

VERIFIED = dict(color="0.35", s=7, alpha=0.45, linewidths=0)
PRUNED = dict(color="tab:red", marker="x", s=18, linewidths=1.0)


def _suptitle(fig, about: About, shown: str) -> None:
    """Study, GPU and objective, then what the plot shows and what it leaves out."""
    left_out = [f"{n} {what}" for n, what in ((about.failed, "failed"), (about.planted, "planted faults"),
                                              (about.unfinished, "unfinished")) if n]
    lines = [about.study, f"GPU {about.gpu}  ·  {about.objective_line()}",
             shown + (f"  ·  not shown: {', '.join(left_out)}" if left_out else "  ·  none failed")]
    fig.suptitle("\n".join(lines), fontsize=10)


def _probed(frame):
    """Pruned trials with a recorded probe time (their objective is the probe's)."""
    pruned = frame[frame["state"] == "PRUNED"]
    return pruned[pruned["objective_us"].notna()]


def _shown(about: About, probed) -> str:
    text = f"{about.verified} verified trials (dots)"
    if about.pruned:
        text += f"  ·  {len(probed)} pruned (×, at the time of their first repetitions)"
        if len(probed) < about.pruned:
            text += f", {about.pruned - len(probed)} more pruned without a time"
    return text


def time_by_dimension(frame, dims: list[str], order: dict, about: About):
    """One panel per dimension: per value, a box of the verified trials' objective (quartiles,
    whiskers at 1.5 IQR) over their dots, the pruned trials as crosses, n under each value."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    done, probed = verified(frame), _probed(frame)
    cols = min(4, len(dims))
    rows = -(-len(dims) // cols)
    fig = Figure(figsize=(4.2 * cols, 3.3 * rows + 1.6))
    axes = fig.subplots(rows, cols, squeeze=False)
    jitter = np.random.default_rng(0)  # the same picture every time
    for i, (ax, dim) in enumerate(zip(axes.flat, dims)):
        shown = frame[frame.index.isin(done.index) | frame.index.isin(probed.index)]
        values = ordered(shown[dim].dropna().unique(), order.get(dim, ()))
        labels = []
        for x, value in enumerate(values, start=1):
            times = done.loc[done[dim] == value, "objective_us"].to_numpy(dtype=float)
            slow = probed.loc[probed[dim] == value, "objective_us"].to_numpy(dtype=float)
            if len(times):
                ax.boxplot([times], positions=[x], widths=0.55, showfliers=False, patch_artist=True,
                           boxprops=dict(facecolor="tab:blue", alpha=0.25), medianprops=dict(color="tab:blue"))
                ax.scatter(x + jitter.uniform(-0.18, 0.18, len(times)), times, **VERIFIED)
            if len(slow):
                ax.scatter(x + jitter.uniform(-0.12, 0.12, len(slow)), slow, **PRUNED)
            labels.append(f"{value}\nn={len(times)}")
        ax.set_xticks(range(1, len(values) + 1), labels, fontsize=8)
        ax.set_xlim(0.4, len(values) + 0.6)
        ax.set_title(dim, fontsize=10)
        if i % cols == 0:
            ax.set_ylabel(about.axis)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(dims):]:
        ax.axis("off")
    handles = [Patch(facecolor="tab:blue", alpha=0.25, edgecolor="tab:blue", label="verified: quartiles, median"),
               Line2D([], [], ls="", marker="o", color="0.35", alpha=0.6, ms=3, label="verified trial"),
               Line2D([], [], ls="", marker="x", color="tab:red", label="pruned trial (probe time)"),
               Line2D([], [], ls="", label="n = verified trials with that value")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    _suptitle(fig, about, _shown(about, probed))
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def time_vs_registers(frame, about: About):
    """The objective against the registers per thread of the forward and of the backward kernel."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    done, probed = verified(frame), _probed(frame)
    panels = [(c, k) for c, k in (("regs_fwd", "forward"), ("regs_bwd", "backward"))
              if c in frame and frame[c].notna().any()]
    fig = Figure(figsize=(5.2 * max(len(panels), 1), 4.6))
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)[0]
    for ax, (col, kernel) in zip(axes, panels):
        a, b = done.dropna(subset=[col]), probed.dropna(subset=[col])
        ax.scatter(a[col].astype(float), a["objective_us"], s=12, alpha=0.6, color="tab:blue",
                   label=f"verified ({len(a)})")
        if len(b):
            ax.scatter(b[col].astype(float), b["objective_us"], **PRUNED, label=f"pruned, probe time ({len(b)})")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # registers are whole numbers
        ax.set_xlabel(f"registers per thread, {kernel} kernel")
        ax.set_ylabel(about.axis)
        ax.set_title(f"{kernel} kernel", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    if not panels:
        axes[0].text(0.5, 0.5, "no registers recorded", ha="center", va="center", transform=axes[0].transAxes)
        axes[0].axis("off")
    _suptitle(fig, about, _shown(about, probed).replace(" (dots)", ""))
    fig.tight_layout()
    return fig


def write(frame, dims: list[str], order: dict, about: About, out: Path) -> list[str]:
    """Save both plots into `out`; returns the files' names."""
    figures = {"time_by_dimension.png": time_by_dimension(frame, dims, order, about),
               "time_vs_registers.png": time_vs_registers(frame, about)}
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=110)
    return list(figures)
