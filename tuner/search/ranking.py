"""The ranked sampler's model: a linear model of log time over the variants' parameter values
and pairs of values, fitted to the study so far, ranking every unseen variant at once.

A variant is a one-hot vector of its values and of its pairs of values (a value of one
dimension with a value of another): a kernel's time is mostly a product of what each choice
costs and how two choices interact (two dimensions whose best values depend on each other),
which is a sum in log time. The fit is ridge regression (a Gaussian prior on every weight, RIDGE its precision), so
it stays defined with fewer variants measured than features, values never seen weigh zero, and
the whole space is scored with one matrix product: a batch of 32 from 5,000 variants costs
milliseconds, where asking Optuna's TPE for 32 trials costs seconds.

Chosen in simulation (`tuner samplers`) on the H100 recordings in tests/data: TPE's
density ratio scored over every variant (with or without a constant liar, or with sampling
noise) needed about 9% of the space to come within 3% of the best at batches of 32; this model,
after a first batch from `spread`, 3.8-5.5% on three recordings and three seed sets (tpe: 6.1-7.3%).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

RIDGE = 2.0
# numpy's BLAS libraries read their thread counts when numpy loads (pip's: OpenBLAS; conda's: MKL)
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def one_blas_thread() -> None:
    """Load numpy with its BLAS on one thread, where it is not loaded yet. The model's products and
    its solve are of a few hundred features: ~1 ms a fit on one thread, where OpenBLAS's threads,
    sharing the cores with a search's compilers, took 20-300 ms (a 2-core machine, GIoU's 204
    features). The variables are set for numpy's load alone: processes started later (a search's
    GPU workers) get the caller's environment. A caller's own setting is kept."""
    if "numpy" in sys.modules:
        return
    saved = {k: os.environ.get(k) for k in BLAS_THREADS}
    for k in BLAS_THREADS:
        os.environ.setdefault(k, "1")
    try:
        import numpy  # noqa: F401
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Ranker:
    def __init__(self, space, seed: int | None = None):
        import numpy as np

        self.variants = list(space)
        self.index = {v.name: i for i, v in enumerate(self.variants)}
        dims = [d for d in space.dims if len(d.values) > 1]
        codes = np.array([[d.values.index(v[d.name]) for d in dims] for v in self.variants], dtype=np.int64)
        columns = [np.ones(len(self.variants))]
        for a, da in enumerate(dims):
            columns += [codes[:, a] == k for k in range(len(da.values))]
            for b in range(a + 1, len(dims)):
                pair = codes[:, a] * len(dims[b].values) + codes[:, b]
                columns += [pair == k for k in range(len(da.values) * len(dims[b].values))]
        features = np.stack(columns, 1).astype(np.float64)
        self.features = features[:, features.any(0)]  # pairs no valid variant has: dropped
        self.rng = np.random.default_rng(seed)

    def spread(self, n: int, unseen: Sequence[str], chosen: Sequence[str] = ()) -> list[str]:
        """n names from `unseen` that together cover the values and pairs of values evenly
        (each pick the one whose values and pairs have been picked least so far; ties by a
        seeded coin): a first batch the model learns more from than a random one."""
        import numpy as np

        candidates = [self.index[name] for name in unseen if name in self.index]
        counts = self.features[[self.index[c] for c in chosen if c in self.index]].sum(0)
        picks = []
        for _ in range(min(n, len(candidates))):
            score = self.features[candidates] @ (1.0 / (1.0 + counts))
            score += self.rng.random(len(candidates)) * 1e-6
            best = int(np.argmax(score))
            picks.append(candidates.pop(best))
            counts = counts + self.features[picks[-1]]
        return [self.variants[i].name for i in picks]

    def pick(self, n: int, outcomes: dict[str, float | None], unseen: Sequence[str]) -> list[str]:
        """Up to n names from `unseen`, best-predicted first. `outcomes`: finished variants'
        objectives (None: failed, left out of the fit). Variants being evaluated are not unseen:
        a batch is the n best predictions, with no need to guess their outcomes."""
        import numpy as np

        known = [(self.index[name], v) for name, v in outcomes.items() if v is not None and v > 0
                 and name in self.index]
        candidates = np.array([self.index[name] for name in unseen if name in self.index], dtype=np.int64)
        if not known or not len(candidates):
            return [self.variants[i].name for i in self.rng.permutation(candidates)[:n]]
        rows = np.array([i for i, _ in known])
        y = np.log(np.array([v for _, v in known]))
        x = self.features[rows]
        weights = np.linalg.solve(x.T @ x + RIDGE * np.eye(x.shape[1]), x.T @ (y - y.mean()))
        predicted = self.features[candidates] @ weights
        predicted += self.rng.random(len(candidates)) * 1e-9  # ties go to a seeded coin, not to order
        return [self.variants[i].name for i in candidates[np.argsort(predicted)[:n]]]
