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
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    head_start()
    for s, e in zip(starts, ends):
        flush()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    samples = sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return Timing(median_us=statistics.median(samples), spread_us=q[2] - q[0], min_us=samples[0], reps=reps)


def interleaved(fns: dict[str, Callable[[], object]], *, flush: L2Flush | None = None, rounds: int = 20,
                **kwargs) -> dict[str, Timing]:
    """Time several candidates in turns (A, B, C, A, B, C, ...) so that drift in clocks or
    temperature hits all alike; returns each one's median over all its repetitions."""
    import torch

    flush = flush or L2Flush()
    per_round = max(kwargs.pop("min_reps", 50) // rounds, 1)
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            pairs = []
            head_start()
            for _ in range(per_round):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                flush()
                s.record()
                fn()
                e.record()
                pairs.append((s, e))
            torch.cuda.synchronize()
            samples[name].extend(s.elapsed_time(e) * 1000.0 for s, e in pairs)
    out = {}
    for name, values in samples.items():
        values.sort()
        q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
        out[name] = Timing(statistics.median(values), q[2] - q[0], values[0], len(values))
    return out
