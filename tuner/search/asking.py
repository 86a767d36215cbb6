"""Asking for trials: which variants a search tries next, claimed in the study so that
searchers sharing it never evaluate a variant twice.

Queued trials (retries, planted faults) go first, through Optuna's ask. Then, by sampler:
- ranked (the default): the first batch is the family's best variants in other studies of
  the storage (another GPU, dtype pair or shape; a warm start) filled up with variants that
  cover every value and pair of values about equally (`Ranker.spread`);
  every later batch is the unseen variants the model ranks best (`ranking.Ranker`). In a search
  that joins the best forward to the best backward (`finalists.joins`), a batch is the variants
  ranked best by their forward time and those ranked best by their backward time, in proportion
  to the best forward's and the best backward's share of their sum (where the joined variant's
  time can gain): ranked by one variant's sum, the larger half decides, and the other half's
  best may never be tried;
- random and grid: unseen variants in a shuffled order (grid: until the space is done);
- tpe: Optuna's TPESampler, asked one trial at a time (it may propose a variant again).
Ranked, random and grid claim each variant in one write (`study.claim`). Once every variant of
the space has a trial (and none is queued), nothing more is asked: a sampler could only propose
a variant again, and the search ends with fewer trials than --trials.
"""

from __future__ import annotations

import random
from typing import Any

from tuner.store import searchers
from tuner.store import study as studies
from tuner.search import finalists
from tuner.search.config import SearchConfig
from tuner.search.ranking import Ranker
from tuner.search.recording import Book, set_user_attrs
from tuner.variant import Variant

WARM_SHARE = 0.5  # of the first batch, at most this much comes from other studies
WARM_TOP = 0.05  # a variant counts for a warm start when in the best 5% of another study


def sampler(name: str, seed: int | None):
    """The Optuna sampler of the study: TPE for tpe; for the others it only fills a queued
    trial's missing parameters."""
    import optuna

    if name == "tpe":
        import warnings

        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=20)
    return optuna.samplers.RandomSampler(seed=seed)


def distributions(space) -> dict:
    from optuna.distributions import CategoricalDistribution

    return {d.name: CategoricalDistribution(list(d.values)) for d in space.dims}


def shuffled(space, seed: int | None) -> list[Variant]:
    """Every variant in a shuffled order: sampling without replacement (Optuna's RandomSampler
    draws a variant again when its parameters repeat), and a partial grid spread over the space."""
    variants = list(space)
    random.Random(seed if seed is not None else random.SystemRandom().random()).shuffle(variants)
    return variants


class Asker:
    def __init__(self, cfg: SearchConfig, book: Book, space, storage, family: str):
        self.cfg, self.book, self.space, self.storage, self.family = cfg, book, space, storage, family
        self.dists = book.dists
        self.names = frozenset(v.name for v in space)
        # the variants still to try, the next one last (popped); tpe proposes its own
        self.queue = shuffled(space, cfg.seed)[::-1] if cfg.sampler != "tpe" else None
        self.ranker = Ranker(space, cfg.seed) if cfg.sampler == "ranked" else None
        self.halves = finalists.joins(cfg, space)  # ranked: picks by forward and by backward time
        self.warm: list[str] = []  # ranked: other studies' best, tried first
        self.learns = self.ranker is not None  # its picks depend on the outcomes so far
        self.first_batch = FIRST_BATCH

    def start(self) -> None:
        """Before the first ask: the seeded order made this searcher's own, the warm start read."""
        self._own_order()
        if self.ranker is not None and self.cfg.warm_start:
            self.warm = warm_start(self.storage, self.family, self.book.study.study_name, self.space)

    def _own_order(self) -> None:
        """Searchers of one study given the same --seed would take the same variants in step,
        each waiting on the other's copy: the second to arrive with a seed shuffles by its own."""
        if self.queue is None or self.cfg.seed is None:
            return
        study_id = self.storage.get_study_id_from_name(self.book.study.study_name)
        key, me = f"tuner:seed:{self.cfg.seed}", searchers.owner()
        taken = self.storage.get_study_system_attrs(study_id).get(key)
        if taken not in (None, me):
            own = hash((self.cfg.seed, me)) & 0xFFFF_FFFF
            self.queue = shuffled(self.space, own)[::-1]
            if self.ranker is not None:  # its first batch's ties too
                self.ranker = Ranker(self.space, own)
        else:
            self.storage.set_study_system_attr(study_id, key, me)

    def exhausted(self) -> bool:
        """No trial is queued and every variant of the space has one in the study (finished, or
        underway here or in another searcher): an ask could only propose a variant again."""
        return self.book.waiting <= 0 and self.names <= self.book.seen

    def ask(self, n: int) -> list[tuple[Any, Variant]]:
        """Up to n new trials: fewer where the space runs out (see `exhausted`)."""
        import optuna

        asked = []
        me = searchers.owner()
        picks = self._picks(n - max(self.book.waiting, 0)) if self.queue is not None else []
        for _ in range(n):
            if not picks and self.book.waiting <= 0 and (self.queue is not None or self.exhausted()):
                break  # ranked, random, grid: their queue holds every unseen variant; tpe: none is left
            variant = picks.pop(0) if picks and self.book.waiting <= 0 else None
            if variant is not None:
                trial = studies.claim(self.book.study, self.space.tuned(variant), self.dists,
                                      {"variant": variant.name, "owner": me})
            else:
                self.book.waiting -= 1
                trial = self.book.study.ask(self.dists)
                variant = self.space.nearest(trial.params)
                if trial.user_attrs.get("fault"):
                    variant = variant.replace(fault=trial.user_attrs["fault"])
                try:
                    set_user_attrs(trial, {"variant": variant.name, "owner": me})
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # failed as ownerless by another searcher (this one stalled): queued again
            self.book.seen.add(variant.name)
            asked.append((trial, variant))
        return asked

    def _picks(self, n: int) -> list[Variant]:
        """Up to n unseen variants (fewer when the space is nearly done)."""
        self.queue = [v for v in self.queue if v.name not in self.book.seen]
        if n <= 0 or not self.queue:
            return []
        outcomes = self.book.outcomes()
        if self.ranker is None or (not outcomes and not self.warm) or len(outcomes) < MIN_OUTCOMES:
            return self._first(n)
        by_name = {v.name: v for v in self.queue}
        if not self.halves:
            return [by_name[name] for name in self.ranker.pick(n, outcomes, list(by_name))]
        fwd_times, bwd_times = self.book.outcomes("fwd"), self.book.outcomes("bwd")
        best = [min((t for t in times.values() if t), default=0.0) for times in (fwd_times, bwd_times)]
        share = best[0] / sum(best) if sum(best) > 0 else 0.5
        by_fwd = n if n == 1 else min(n - 1, max(1, round(n * share)))  # at least one pick each
        fwd = self.ranker.pick(by_fwd, fwd_times, list(by_name))
        taken = set(fwd)
        bwd = self.ranker.pick(n - len(fwd), bwd_times, [name for name in by_name if name not in taken])
        return [by_name[name] for name in fwd + bwd]

    def _first(self, n: int) -> list[Variant]:
        """Warm-start variants (up to WARM_SHARE of n), then for ranked variants that spread
        over the values and pairs of values, for the others the shuffled order."""
        by_name = {v.name: v for v in self.queue}
        warm = [by_name[name] for name in self.warm if name in by_name][: int(n * WARM_SHARE)]
        self.warm = [name for name in self.warm if name not in {v.name for v in warm}]
        self.book.report.warm_started += len(warm)
        taken = {v.name for v in warm}
        if self.ranker is not None:
            unseen = [v.name for v in reversed(self.queue) if v.name not in taken]
            return warm + [by_name[name] for name in self.ranker.spread(n - len(warm), unseen, [*taken, *self.book.seen])]
        rest = [v for v in reversed(self.queue) if v.name not in taken][: n - len(warm)]
        return warm + rest


# ranked: the first batch (a warm start, then variants spread evenly over values and pairs of
# values) is measured before the second is ranked. Simulation, bf16/uint8 recording, 60 seeds:
# spread 32 first needed a median of 4.1% of the space (20-seed medians 3.6-4.5%), spread 24 the
# same median but 3.0-7.9% between seed sets, 24 random ones 7.0% (5.6-10.7%).
FIRST_BATCH = 32
MIN_OUTCOMES = 8  # finished variants the model needs before it ranks; before that, the shuffled order


def warm_start(storage, family: str, this_study: str, space) -> list[str]:
    """Variants of `space` in the best WARM_TOP of the family's other studies in `storage`
    (matched on their tuned parameters: another dtype pair's variant of the same shape), the
    most often and highest ranked first."""
    import optuna

    tuned = {tuple(sorted(space.tuned(v).items(), key=str)): v.name for v in space}
    score: dict[str, float] = {}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if summary.study_name == this_study or summary.user_attrs.get("family") != family:
            continue
        st = optuna.load_study(study_name=summary.study_name, storage=storage)
        done = sorted(((t.value, t.params) for t in st.get_trials(deepcopy=False, states=(
            optuna.trial.TrialState.COMPLETE,)) if t.value is not None and not t.user_attrs.get("fault")),
                      key=lambda pair: pair[0])
        keep = max(1, int(len(done) * WARM_TOP))
        for rank, (_, params) in enumerate(done[:keep]):
            name = tuned.get(tuple(sorted(params.items(), key=str)))
            if name is not None:
                score[name] = score.get(name, 0.0) + 1.0 - rank / keep
    return sorted(score, key=lambda name: -score[name])
