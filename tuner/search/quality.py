"""Search quality in simulation: how many trials a sampler needs to find a near-best variant.

A recording of the whole space (`--simulate` file) gives the true best. Each run is a real
`tuner.search.Search` replaying that recording, with its own seed and a throw-away
TUNER_HOME, stopped once it has found a variant within `within` of the best. A run's count
is the number of trials up to and including the first such one, in trial order: failed and
duplicate trials count, as each costs a trial in a live search too.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from tuner import families, search
from tuner.store import records
from tuner.search import ranking
from tuner.search.evaluate import SimulatedEvaluator


# The batches a search asks on a 16-core host (`LiveEvaluator.batch_size` 32; ranked asks four
# times that after its first): a model learns only between batches, one behind (the next compiles
# while the last is timed), so simulate that rather than the simulator's own small batches.
LIVE_BATCH = {"ranked": 128, "tpe": 32}


def dataset_best(dataset: Path, problem, objective: str = "fwd+bwd") -> float:
    """The best objective among the verified variants recorded for `problem`."""
    latest = {r["variant"]: r for r in records.read_some(Path(dataset), "--simulate")
              if r.get("problem") == problem.key() and isinstance(r.get("variant"), str)}
    values = [search.objective_value(r, objective) for r in latest.values() if r.get("status") == "ok"]
    if not values:
        from tuner.errors import TunerError

        raise TunerError(f"{dataset} holds no verified measurement for problem {problem.key()}")
    return min(values)


def space_size(problem) -> int:
    return len(families.get(problem.family).space_for(problem.__dict__))


@contextlib.contextmanager
def _scratch_home():
    """A temporary TUNER_HOME, so runs leave nothing in the user's studies/."""
    before = os.environ.get("TUNER_HOME")
    with tempfile.TemporaryDirectory(prefix="tuner-quality-") as home:
        os.environ["TUNER_HOME"] = home
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("TUNER_HOME", None)
            else:
                os.environ["TUNER_HOME"] = before


def trials_to_reach(dataset: Path, problem, sampler: str, seed: int, within: float = 0.03,
                    max_trials: int | None = None, objective: str = "fwd+bwd") -> int | None:
    """Trials a search with `sampler` and `seed` needs to finish one whose objective is at most
    (1 + within) times the dataset's best; None if it has not within `max_trials` (default:
    the size of the space)."""
    import optuna

    target = dataset_best(dataset, problem, objective) * (1 + within)
    limit = max_trials or space_size(problem)
    with _scratch_home():
        cfg = search.SearchConfig(
            gpu="auto", problem=problem, trials=limit, sampler=sampler, objective=objective, simulate=Path(dataset),
            storage=optuna.storages.InMemoryStorage(), study=f"quality-{sampler}-{seed}", seed=seed,
            batch=LIVE_BATCH.get(sampler),
            progress=False, stop_when=lambda best: best <= target)
        evaluator = SimulatedEvaluator(cfg.simulate, problem, objective, cfg.gpu)
        try:
            run = search.Search(cfg, evaluator)
            run.run()
        finally:
            evaluator.close()
    hits = [t.number for t in run.study.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and t.value <= target]
    count = min(hits) + 1 if hits else None
    return count if count is not None and count <= limit else None


def sampler_table(dataset: Path, problem, samplers: Iterable[str], seeds: Iterable[int] = range(20),
                  within: float = 0.03, max_trials: int | None = None, objective: str = "fwd+bwd",
                  on_run: Callable[[str, int, int | None], None] | None = None, jobs: int = 1):
    """One row per sampler: quartiles, min and max of trials_to_reach over the seeds (NaN where
    a run that never reached decides one), the median as a share of the space, and how many
    runs reached. `on_run(sampler, seed, count)` hears of each run as it ends (a full table
    takes minutes on one core). `jobs` > 1: the runs go to that many processes (each run is
    the same wherever it runs: its seed decides it)."""
    import pandas as pd

    size = space_size(problem)
    seeds = list(seeds)
    samplers = list(samplers)
    counts = _counts(dataset, problem, [(name, seed) for name in samplers for seed in seeds],
                     (within, max_trials, objective), on_run, jobs)
    rows = []
    for name in samplers:
        got = [counts[(name, seed)] for seed in seeds]
        ordered = sorted(math.inf if c is None else c for c in got)
        median = _quantile(ordered, 0.5)
        rows.append({
            "sampler": name, "median trials": median, "p25": _quantile(ordered, 0.25),
            "p75": _quantile(ordered, 0.75), "min": _quantile(ordered, 0.0), "max": _quantile(ordered, 1.0),
            "median % of space": round(100 * median / size, 1),
            "reached": f"{sum(c is not None for c in got)}/{len(seeds)}",
        })
    return pd.DataFrame(rows)


def _counts(dataset: Path, problem, runs: list[tuple[str, int]], how: tuple, on_run, jobs: int) -> dict:
    """(sampler, seed) -> trials_to_reach(..., *how) of each run, here or in `jobs` processes."""
    counts: dict[tuple[str, int], int | None] = {}
    if jobs <= 1 or len(runs) <= 1:
        for name, seed in runs:
            counts[(name, seed)] = trials_to_reach(dataset, problem, name, seed, *how)
            if on_run is not None:
                on_run(name, seed, counts[(name, seed)])
        return counts
    import concurrent.futures
    import multiprocessing

    # spawned: a fresh interpreter imports the search alone (a forked one would copy this process's
    # Optuna storages and threads)
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(min(jobs, len(runs)), mp_context=context,
                                                initializer=ranking.one_blas_thread)  # a process a core
    try:
        pending = {pool.submit(_run, str(dataset), problem.family, dict(problem.__dict__), name, seed, how): (name, seed)
                   for name, seed in runs}
        for done in concurrent.futures.as_completed(pending):
            name, seed = pending[done]
            counts[(name, seed)] = done.result()
            if on_run is not None:
                on_run(name, seed, counts[(name, seed)])
    except BaseException:  # Ctrl-C, a failed run: the queued runs are dropped and the running ones ended
        _stop(pool)
        raise
    pool.shutdown()
    return counts


def _stop(pool) -> None:
    """End a process pool now: its queue dropped, its workers terminated (a shutdown that waits
    ran every queued run first, 20 s and more after a Ctrl-C, or never returned)."""
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14
    if terminate is not None:
        terminate()
        return
    workers = list((getattr(pool, "_processes", None) or {}).values())  # before shutdown forgets them
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()
    for process in workers:
        process.join(timeout=10)
    # The pool's own thread ends once its workers have: waited for here, because Python 3.11's exit
    # wakes a thread still running through a pipe that thread may close meanwhile (OSError, bad file
    # descriptor, printed at the command's end)
    if manager is not None:
        manager.join(timeout=10)


def _run(dataset: str, family: str, fields: dict, name: str, seed: int, how: tuple) -> int | None:
    """One run of `sampler_table`'s, in a process of its own."""
    return trials_to_reach(Path(dataset), families.get(family).Problem(**fields), name, seed, *how)


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between the two nearest runs, as numpy's default; NaN where a run
    that never reached (inf) is one of them, since its count is unknown."""
    pos = q * (len(ordered) - 1)
    lo, hi = ordered[math.floor(pos)], ordered[math.ceil(pos)]
    if math.isinf(hi):
        return math.nan
    return float(lo + (hi - lo) * (pos - math.floor(pos)))


def markdown(table) -> str:
    """The table in markdown; whole numbers without a decimal point, NaN (not reached) as '-'."""
    def cell(v) -> str:
        if isinstance(v, float):
            return "-" if v != v else (f"{v:.0f}" if v.is_integer() else f"{v:g}")
        return str(v)

    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for _, r in table.iterrows()]
    return "\n".join(lines) + "\n"
