"""Input sets and their float64 answers, shared by the variants a worker checks.

The reference costs more than a variant's run (float64, autograd or the CPU), so a
worker keeps a few input sets per check and gives them out in turn: each set is
computed once and checks up to `uses` variants, then is replaced by a fresh one
(new random inputs, new answers). Consecutive variants get different sets, and
no set lives long: a variant that passes only on particular inputs is still caught
by the next set, while the reference runs once per `uses` checks instead of once
per check. Every variant still writes into fresh, NaN-filled outputs. Large sets are kept fewer
(at most an eighth of the GPU's memory in a key's sets: a 16384 x 128256 cross-entropy's set,
its logits and their float64 gradient, is 20 GiB), and a used-up set is dropped before its
replacement is made.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Hashable

SETS = 3
USES = 8
MAX_KEYS = 64  # checks of other problems drop the oldest sets
SHARE = 8  # a key's sets take at most 1/SHARE of their device's memory (a set at least)
CPU_BYTES = 4 << 30  # the same bound for sets on the CPU


def nbytes(case: Any) -> tuple[int, Any]:
    """The bytes of the tensors in `case` (nested dicts, lists, tuples), and one tensor's device."""
    import torch

    if isinstance(case, torch.Tensor):
        return case.numel() * case.element_size(), case.device
    parts = case.values() if isinstance(case, dict) else case if isinstance(case, (list, tuple)) else ()
    total, device = 0, None
    for part in parts:
        n, d = nbytes(part)
        total, device = total + n, device or d
    return total, device


def _budget(device) -> int:
    import torch

    if device is not None and device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // SHARE
    return CPU_BYTES


class Cases:
    def __init__(self, sets: int = SETS, uses: int = USES):
        self.sets, self.uses = sets, uses
        self._pool: dict[Hashable, list[list]] = {}  # key -> [[case, uses so far], ...]
        self._turn: dict[Hashable, int] = {}
        self._keep: dict[Hashable, int] = {}  # sets a key keeps: fewer where they are large (measured when made)
        self._seeds = random.SystemRandom()

    def _slots(self, key: Hashable) -> list[list]:
        if key not in self._pool and len(self._pool) >= MAX_KEYS:
            oldest = next(iter(self._pool))
            del self._pool[oldest]
            self._turn.pop(oldest, None)
            self._keep.pop(oldest, None)
        return self._pool.setdefault(key, [])

    def prime(self, key: Hashable, make: Callable[[int], Any]) -> None:
        """Make `key`'s first set ahead of the first check (a worker warming up: the first set
        pays CUDA's and torch's first-use costs); the next checks make the others as usual."""
        slots = self._slots(key)
        if not slots:
            slots.append([make(self._seeds.randrange(1 << 62)), 0])
            self._keep[key] = self._sets(slots[0][0])

    def get(self, key: Hashable, make: Callable[[int], Any]) -> Any:
        """The next set for `key`; `make(seed)` builds a new one when its turn's set is used up."""
        slots = self._slots(key)
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        i = turn % self._keep.get(key, self.sets)
        if i >= len(slots):
            slots.append(None)
        if slots[i] is None or slots[i][1] >= self.uses:
            slots[i] = None  # the used-up set goes before its replacement is made
            slots[i] = [make(self._seeds.randrange(1 << 62)), 0]
            keep = self._keep[key] = self._sets(slots[i][0])  # a large set: fewer kept, this one among them
            if i >= keep:
                slots[0], i = slots[i], 0
            del slots[keep:]
        slots[i][1] += 1
        return slots[i][0]

    def _sets(self, made: Any) -> int:
        """How many sets a key keeps, given one of them: `sets`, fewer where they would take more
        than the budget."""
        size, device = nbytes(made)
        return max(1, min(self.sets, _budget(device) // max(size, 1)))


def sized(module, problem: dict) -> dict:
    """The problem a search checks each variant at: its sizes capped by the family's `CHECK_SIZES`
    (name -> largest value), sizes that set how much memory the inputs take and not how the
    kernels run (an embedding table's rows: a bag's entries still index it, its bags and their
    lengths stay the problem's). A 5M-row table's set, its float64 gradient included, is 8 GB and
    its reference seconds; 65,536 rows make it 40 MB. The finalists are checked at the problem's
    own sizes before one wins (tuner.search.finalists)."""
    caps = getattr(module, "CHECK_SIZES", {})
    return {**problem, **{k: min(problem[k], v) for k, v in caps.items() if isinstance(problem.get(k), int)}}
