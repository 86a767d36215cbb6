"""The one timing function: CUDA events, warm-up, L2 flush, repetitions budgeted in time.

Every time the project reports comes from `bench`. Each repetition first writes a
buffer larger than L2 (so the kernel reads its inputs from memory, as it does in a
training step), then records events around the call alone. Repetitions continue
until both `min_reps` and `budget_ms` of measured time are reached (capped by
`max_reps`); the median and the spread (interquartile range) are returned.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Callable

DEFAULT_FLUSH_BYTES = 256 * 1024 * 1024  # over any GPU's L2 today; Triton's do_bench uses the same
HEAD_START_CYCLES = 2_000_000  # about 1-2 ms of GPU clock


_CYCLE_US: list[float] = []  # µs a spin cycle takes on this process's GPU (measured once)


def head_start(us: float | None = None) -> float:
    """Keep the GPU busy for about `us` µs (a spin kernel, not timed; default ~1 ms) while the
    host queues the timed repetitions behind it, so that the events time the GPU's work and not
    how fast a busy host launches: otherwise the GPU runs ahead and idles inside the timed
    window. Returns the µs it keeps the GPU busy (0 where torch has no spin kernel)."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return 0.0
    if not _CYCLE_US:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        sleep(HEAD_START_CYCLES)
        end.record()
        end.synchronize()
        _CYCLE_US.append(start.elapsed_time(end) * 1000.0 / HEAD_START_CYCLES)
    cycles = HEAD_START_CYCLES if us is None else max(int(us / _CYCLE_US[0]), 1000)
    sleep(cycles)
    return cycles * _CYCLE_US[0]


@dataclass(frozen=True)
class Timing:
    median_us: float
    spread_us: float  # interquartile range
    min_us: float
    reps: int

    def as_dict(self) -> dict:
        return asdict(self)


class L2Flush:
    """A buffer at least the size of L2; `()` overwrites it."""

    def __init__(self, device=None, nbytes: int | None = None):
        import torch

        if nbytes is None:
            props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
            l2 = getattr(props, "L2_cache_size", 0) or DEFAULT_FLUSH_BYTES // 2
            nbytes = max(l2, 16 * 1024 * 1024)
        self.buffer = torch.empty(nbytes // 4, dtype=torch.int32, device=device or "cuda")
        self._us: float | None = None

    def __call__(self) -> None:
        self.buffer.fill_(0x5A5A5A5A)

    @property
    def us(self) -> float:
        """One flush's GPU time in µs (measured once)."""
        if self._us is None:
            self()
            self._us = _estimate_us(self)
        return self._us


SPARE_US = 500.0  # a head start's spin beyond what the next call needs: a GPU-bound call needs one
GPU_SHARE = 0.8  # of a call's estimated GPU time, counted as queued work (estimates run high)


def _queue(order: list, flush: L2Flush, gpu_us: dict) -> dict:
    """Queue one timed repetition of each `(key, fn)` in `order`, each after an L2 flush, and
    return key -> [(start, end) events]. The events must time the GPU's work, not how fast the
    host launches: if the GPU ran out of queued work, an event pair would include the host's
    time to launch the call (medians of an 8 µs kernel read 15-27 µs that way). So the host
    keeps count of the GPU work it has queued ahead of itself (each call's estimated GPU time,
    `gpu_us[key]`, less the host time it took to queue it) and, where that lead is shorter than
    the time it takes to queue a call, queues a head start long enough to cover it. A call the
    GPU runs slower than the host queues it (a large kernel) needs one head start in all; one the
    host queues slower (a Python op, an eager loss) gets a spin as long as the difference."""
    import time

    import torch

    pairs: dict = {}
    lead, host = 0.0, 0.0  # µs of GPU work queued ahead; the slowest recent queueing of one call
    for key, fn in order:
        need = host + 50.0
        if lead < need:
            lead += head_start(need - lead + SPARE_US)
        began = time.perf_counter()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush()
        s.record()
        fn()
        e.record()
        took = (time.perf_counter() - began) * 1e6
        host = max(took, 0.9 * host)
        lead = max(lead + GPU_SHARE * (gpu_us[key] + flush.us) - took, 0.0)
        pairs.setdefault(key, []).append((s, e))
    return pairs


def _elapsed(pairs: list) -> list[float]:
    return [s.elapsed_time(e) * 1000.0 for s, e in pairs]


def _estimate_us(fn: Callable[[], object]) -> float:
    """One call's GPU time in µs (events around it; after its warm-up)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return max(start.elapsed_time(end) * 1000.0, 1.0)


def _samples(fn: Callable[[], object], flush: L2Flush, reps: int, gpu_us: float) -> list[float]:
    """`reps` timings of `fn` in µs, each after an L2 flush (`_queue`)."""
    import torch

    pairs = _queue([(0, fn)] * reps, flush, {0: gpu_us})
    torch.cuda.synchronize()
    return _elapsed(pairs[0])


def _summary(samples: list[float]) -> Timing:
    samples = sorted(samples)
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return Timing(median_us=statistics.median(samples), spread_us=q[2] - q[0], min_us=samples[0], reps=len(samples))


def bench(fn: Callable[[], object], *, flush: L2Flush | None = None, warmup: int = 3, min_reps: int = 50,
          budget_ms: float = 25.0, max_reps: int = 2000) -> Timing:
    """Time `fn` (GPU time between events around it), flushing L2 before each repetition."""
    import torch

    flush = flush or L2Flush()
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    # One call's estimate sizes the repetitions (between syncs, so that a slow kernel does not
    # run thousands of times) and the head starts they need.
    estimate_us = _estimate_us(fn)
    reps = int(min(max_reps, max(min_reps, budget_ms * 1000.0 / estimate_us)))
    return _summary(_samples(fn, flush, reps, estimate_us))


def interleaved(fns: dict[str, Callable[[], object]], *, flush: L2Flush | None = None, rounds: int = 20,
                samples: dict[str, list[float]] | None = None, **kwargs) -> dict[str, Timing]:
    """Time several candidates in turns (A, B, C, A, B, C, ...) so that drift in clocks or
    temperature hits all alike; returns each one's median over all its repetitions. `samples`
    (name -> µs) keeps them: a later call with it adds to them (an extra round for the close)."""
    import torch

    flush = flush or L2Flush()
    per_round = max(kwargs.pop("min_reps", 50) // rounds, 1)
    samples = {} if samples is None else samples
    for name in fns:
        samples.setdefault(name, [])
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    gpu_us = {name: _estimate_us(fn) for name, fn in fns.items()}
    for _ in range(rounds):  # a round: each candidate's repetitions in turn, then one sync
        pairs = _queue([(name, fn) for name, fn in fns.items() for _ in range(per_round)], flush, gpu_us)
        torch.cuda.synchronize()
        for name in fns:
            samples[name].extend(_elapsed(pairs[name]))
    return {name: _summary(samples[name]) for name in fns}
