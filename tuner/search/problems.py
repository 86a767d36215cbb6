"""Several problems in one search: the shapes a training run calls an op with (`tuner.capture`
writes them, `tuner search --problems FILE` reads them), each its own study.

One command tunes them all, in the order of their share of the captured time: the trials are
split by that share (each problem gets at least `LEAST`), the build cache is shared (a variant
compiled for one shape of a dtype pair is found built for the next), the GPU's worker is started
once, and each problem's first batch is warm-started from the best variants of the problems
searched before it (the ranked sampler reads the family's other studies). The export then binds
every problem's winner, or torch's op where the winner did not beat it.
"""

from __future__ import annotations

import dataclasses
import time

from tuner.search.config import SearchConfig, SearchReport

LEAST = 64  # trials a problem gets however small its share: the first batch (32) and one ranked batch


def split(shares: list[float], each: int, least: int = LEAST) -> list[int]:
    """Trials per problem: `each` per problem on average, in proportion to the shares (which need
    not add up to 1), each at least `least` and at most twice `each` (the ranked sampler finds a
    problem's best in a few batches; a dominant share would otherwise hold the GPU for the rest)."""
    whole = sum(shares)
    if whole <= 0:
        shares, whole = [1.0] * len(shares), float(len(shares))
    total = each * len(shares)
    return [min(max(least, round(total * s / whole)), max(2 * each, least)) for s in shares]


def configs(base: SearchConfig, problems: list, shares: list[float]) -> list[SearchConfig]:
    """One search per problem, with `base`'s settings and `base.trials` on average per problem."""
    counts = split(shares, base.trials)
    return [dataclasses.replace(base, problem=p, trials=n, study=None) for p, n in zip(problems, counts)]


def run(cfgs: list[SearchConfig], on_start=None, on_end=None) -> list[SearchReport]:
    """Search each config in turn with one evaluator (one worker per GPU, switched from problem to
    problem); a finished study is read, not searched again. `on_start(i, cfg)` is called before
    each search, `on_end(i, report)` after it."""
    from tuner.search import pipeline

    reports, evaluator = [], None
    try:
        for i, cfg in enumerate(cfgs):
            if on_start is not None:
                on_start(i, cfg)
            started = time.monotonic()
            report = pipeline.finished(cfg)
            if report is None:
                if cfg.simulate or evaluator is None:
                    if evaluator is not None:
                        evaluator.close()
                    evaluator = pipeline.make_evaluator(cfg)
                else:
                    evaluator.switch(cfg.problem)
                report = pipeline.Search(cfg, evaluator).run()
            else:
                report.wall_s = time.monotonic() - started
            reports.append(report)
            if on_end is not None:
                on_end(i, report)
    finally:
        if evaluator is not None:
            evaluator.close()
    return reports
