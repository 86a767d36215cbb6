"""Input sets and their float64 answers, shared by the variants a worker checks.

The reference costs more than a variant's run (float64, autograd or the CPU), so a
worker keeps a few input sets per check and gives them out in turn: each set is
computed once and checks up to `uses` variants, then is replaced by a fresh one
(new random inputs, new answers). Consecutive variants get different sets, and
no set lives long: a variant that passes only on particular inputs is still caught
by the next set, while the reference runs once per `uses` checks instead of once
per check. Every variant still writes into fresh, NaN-filled outputs.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Hashable

SETS = 3
USES = 8
MAX_KEYS = 64  # checks of other problems drop the oldest sets


class Cases:
    def __init__(self, sets: int = SETS, uses: int = USES):
        self.sets, self.uses = sets, uses
        self._pool: dict[Hashable, list[list]] = {}  # key -> [[case, uses so far], ...]
        self._turn: dict[Hashable, int] = {}
        self._seeds = random.SystemRandom()

    def _slots(self, key: Hashable) -> list[list]:
        if key not in self._pool and len(self._pool) >= MAX_KEYS:
            oldest = next(iter(self._pool))
            del self._pool[oldest]
            self._turn.pop(oldest, None)
        return self._pool.setdefault(key, [])

    def prime(self, key: Hashable, make: Callable[[int], Any]) -> None:
        """Make `key`'s first set ahead of the first check (a worker warming up: the first set
        pays CUDA's and torch's first-use costs); the next checks make the others as usual."""
        slots = self._slots(key)
        if not slots:
            slots.append([make(self._seeds.randrange(1 << 62)), 0])

    def get(self, key: Hashable, make: Callable[[int], Any]) -> Any:
        """The next set for `key`; `make(seed)` builds a new one when its turn's set is used up."""
        slots = self._slots(key)
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        i = turn % self.sets
        if i >= len(slots):
            slots.append([make(self._seeds.randrange(1 << 62)), 0])
        elif slots[i][1] >= self.uses:
            slots[i] = [make(self._seeds.randrange(1 << 62)), 0]
        slots[i][1] += 1
        return slots[i][0]
