"""Stopping the timing of clearly slow variants early, through Optuna's pruning.

The worker times a verified variant for a few repetitions first (a probe) and asks
the search whether to go on; the search reports the probe's objective as the
trial's intermediate value and asks the study's pruner (`trial.should_prune()`).
A pruned trial is told PRUNED with the probe's time: it never wins, and the
sampler still learns that its region is slow. Variants that go on get the full
timing budget, and the winner is re-timed with more repetitions anyway.
A search that joins halves (`search.finalists.joins`) decides without the pruner: it prunes only
a probe behind in both halves (`Book.behind_in_both`).
"""

from __future__ import annotations

from typing import Callable

import optuna

from tuner.search.config import PRUNE_FACTOR as DEFAULT_FACTOR

PROBE_REPS = 10


class SlowerThanBest(optuna.pruners.BasePruner):
    """Prune a trial whose latest intermediate value is over `factor` x the best finished value:
    `best()`'s where the caller keeps it (a search: tuner.search.pipeline), else the study's
    (`study.best_value` reads every trial, ~1 ms of 200, while the probe's worker waits)."""

    def __init__(self, factor: float = DEFAULT_FACTOR, best: Callable[[], float | None] | None = None):
        if factor <= 1.0:
            raise ValueError(f"the pruning factor must be over 1, got {factor}")
        self.factor = factor
        self.best = best

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None:
            return False
        best = self.best() if self.best is not None else best_value(study)
        return best is not None and trial.intermediate_values[step] > self.factor * best


def best_value(study) -> float | None:
    """The study's best finished value; None before one has finished."""
    try:
        return study.best_value
    except ValueError:
        return None


def pruner(factor: float | None):
    """The search's pruner: SlowerThanBest(factor), or none for a factor of None or 0."""
    return SlowerThanBest(factor) if factor else optuna.pruners.NopPruner()
