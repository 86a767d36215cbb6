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
CHUNK = 16  # repetitions queued behind one head start: the host queues them in well under its time


def head_start() -> None:
    """Keep the GPU busy for a moment (a spin kernel, not timed) while the host queues the timed
    repetitions behind it, so that the events time the GPU's work and not how fast a busy host
    launches: otherwise the GPU runs ahead and idles inside the timed window."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(HEAD_START_CYCLES)


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

    def __call__(self) -> None:
        self.buffer.fill_(0x5A5A5A5A)


def _samples(fn: Callable[[], object], flush: L2Flush, reps: int) -> list[float]:
    """`reps` timings of `fn` in µs, each after an L2 flush, queued in chunks of CHUNK behind a head
    start each. One head start for hundreds of repetitions is not enough: the host queues a
    flush and a call in ~30 µs, the GPU runs them in ~25, so after a millisecond the GPU waits
    on the host and every event pair times the host's launch rate, not the kernel (medians of
    a 8 µs kernel read 15-27 µs that way, and the ranking followed the host's jitter)."""
    import torch

    pairs = []
    for first in range(0, reps, CHUNK):
        head_start()
        for _ in range(min(CHUNK, reps - first)):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            flush()
            s.record()
            fn()
            e.record()
            pairs.append((s, e))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 for s, e in pairs]


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
    # Estimate one call to size the batch of repetitions (between syncs, so that
    # a slow kernel does not run thousands of times).
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    estimate_ms = max(start.elapsed_time(end), 1e-3)
    reps = int(min(max_reps, max(min_reps, budget_ms / estimate_ms)))
    return _summary(_samples(fn, flush, reps))


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
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].extend(_samples(fn, flush, per_round))
    return {name: _summary(samples[name]) for name in fns}
