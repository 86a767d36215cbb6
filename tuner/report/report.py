"""`tuner report`: what a study says about the space, as a CSV, importances, tables and plots.

Every table and plot names the study, the GPU and the objective, and says how many trials it
leaves out (pruned, failed), so that each file reads on its own (tables: tuner/report/tables.py;
plots: tuner/report/plots.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tuner import paths
from tuner.report import plots as report_plots
from tuner.store import study as studies
from tuner.store import trials
from tuner.report.tables import by_dimension, describe, index, markdown


def report(st, out: Path) -> dict:
    """Write trials.csv, importance.json, by_dimension.csv/.md, plots (PNG) and an index
    (README.txt) of a study into `out`, all at the end (a report interrupted or failing half-way
    leaves nothing, tuner.paths.staged); returns the importances."""
    with paths.staged(out, last="README.txt") as staging:
        return _report(st, staging)


def _report(st, out: Path) -> dict:
    import optuna

    problem = st.user_attrs.get("problem", {})
    space = studies.family_of(st).space_for(problem)
    frame = trials.trials_frame(st, space)
    about = describe(st, frame)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "trials.csv", index=False)
    importance: dict[str, float] = {}
    if about.verified >= 2:
        # PED-ANOVA needs no extra packages (fANOVA would need scikit-learn).
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        importance = optuna.importance.get_param_importances(st, evaluator=evaluator)
    (out / "importance.json").write_text(json.dumps(importance, indent=1))
    written = ["trials.csv", "importance.json"]
    if about.verified:
        dims = [d.name for d in space.dims]
        order = {d.name: d.values for d in space.dims}
        table = by_dimension(frame, dims, order)
        table.to_csv(out / "by_dimension.csv", index=False)
        (out / "by_dimension.md").write_text(markdown(table, about))
        written += ["by_dimension.csv", "by_dimension.md"]
        written += report_plots.write(frame, dims, order, about, out)
    (out / "README.txt").write_text(index(about, written, importance))
    return importance
