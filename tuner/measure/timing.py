"""The one timing function: CUDA events, warm-up, L2 flush, repetitions budgeted in time.

Every time the project reports comes from `bench` (or from its parts, `Repetitions`, where a
search probes a variant before timing it). Each repetition first writes a
buffer larger than L2 (so the kernel reads its inputs from memory, as it does in a
training step), then records events around the call alone. Repetitions continue
until both `min_reps` and `budget_ms` of measured time are reached (capped by
`max_reps`), or, in a search (`Repetitions.take_until(precision=...)`), until the median is
known well enough to rank by; the median and the spread (interquartile range) are returned.

A search's variants are timed by replaying a CUDA graph of GRAPH_CHUNK repetitions
(`bench(..., graph=True)`, `Repetitions.take(..., graph=True)`): the host then pays one launch a
chunk instead of ~50 µs a repetition (a flush, two events and the call, each through Python), so
that a variant costs its GPU work; its probe's repetitions come from the same graph and count in
its timing. A call that cannot be captured is timed repetition by repetition.
"""

from __future__ import annotations

import collections
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Callable

from tuner.measure import graphs
from tuner.measure.graphs import spoiled  # noqa: F401 (the worker asks timing whether a capture failed)

DEFAULT_FLUSH_BYTES = 256 * 1024 * 1024  # over any GPU's L2 today; Triton's do_bench uses the same
HEAD_START_CYCLES = 2_000_000  # about 1-2 ms of GPU clock
SPARE_US = 500.0  # a head start's spin beyond what the next call needs: a GPU-bound call needs one
MAX_SPIN_US = 5000.0  # a head start covers a call's typical queueing up to this, not a stall
GPU_SHARE = 0.8  # of a call's estimated GPU time, counted as queued work (estimates run high)
GRAPH_CHUNK = 16  # repetitions a captured graph holds: its capture costs about as many direct ones

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
    if not _CYCLE_US:  # the spin's pace, measured behind a first spin (loaded, and the GPU busy)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        sleep(HEAD_START_CYCLES // 2)
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
    graphed: bool = False  # from replays of a captured graph (`bench(..., graph=True)`)

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
            self._us = _estimate(self).gpu_us
        return self._us


def _queue(order: list, flush: L2Flush, estimates: dict) -> dict:
    """Queue one timed repetition of each `(key, fn)` in `order`, each after an L2 flush, and
    return key -> [(start, end) events]. The events must time the GPU's work, not how fast the
    host launches: if the GPU ran out of queued work, an event pair would include the host's
    time to launch the call (medians of an 8 µs kernel read 15-27 µs that way). So the host
    keeps count of the GPU work it has queued ahead of itself (each call's estimated GPU time,
    `estimates[key]` = `_Estimate`, less the host time it took to queue it) and, where that lead
    is shorter than the time it takes to queue the next call, queues a head start long enough to
    cover it. A call the GPU runs slower than the host queues it (a large kernel) needs one head
    start in all; one the host queues slower (a Python op, an eager loss) gets a spin as long as
    the difference."""
    import time

    import torch

    pairs: dict = {}
    lead = 0.0  # µs of GPU work queued ahead of the host
    for key, fn in order:
        guess = estimates[key]
        if lead < MAX_SPIN_US + 50.0:  # else the lead covers any call: no need to look
            # a typical call's queueing (one that waited, on a full launch queue or a collection,
            # says nothing of the next), and at most MAX_SPIN_US: a spin does not wait out a stall
            need = min(statistics.median_high(guess.host), MAX_SPIN_US) + 50.0
            if lead < need:
                lead += head_start(need - lead + SPARE_US)
        began = time.perf_counter()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        flush()
        s.record()
        fn()
        e.record()
        took = (time.perf_counter() - began) * 1e6
        guess.host.append(took)
        lead = max(lead + GPU_SHARE * (guess.gpu_us + flush.us) - took, 0.0)
        pairs.setdefault(key, []).append((s, e))
    return pairs


def _elapsed(pairs: list) -> list[float]:
    return [s.elapsed_time(e) * 1000.0 for s, e in pairs]


class _Estimate:
    """A call's GPU time and the host's recent times to queue it, in µs (`_queue` keeps the latter)."""

    def __init__(self, gpu_us: float, host_us: float):
        self.gpu_us = gpu_us
        self.host: collections.deque = collections.deque([host_us], maxlen=8)


def _estimate(fn: Callable[[], object]) -> _Estimate:
    """One call's GPU time (after its warm-up): events around it, behind a spin longer than the
    host takes to queue it, so that neither the launch nor the host's pace counts."""
    import time

    import torch

    best, host_us = float("inf"), 0.0
    for _ in range(2):
        began = time.perf_counter()
        fn()
        host_us = (time.perf_counter() - began) * 1e6
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        head_start(1.5 * host_us + 100.0)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1000.0)
    return _Estimate(max(best, 1.0), host_us)


def _samples(fn: Callable[[], object], flush: L2Flush, reps: int, estimate: _Estimate) -> list[float]:
    """`reps` timings of `fn` in µs, each after an L2 flush (`_queue`)."""
    import torch

    pairs = _queue([(0, fn)] * reps, flush, {0: estimate})
    torch.cuda.synchronize()
    return _elapsed(pairs[0])


def median_known(samples: list[float], precision: float) -> bool:
    """Whether the median of `samples` is known within ±`precision` of it: its 95% confidence
    interval from order statistics (distribution-free: the ranks n/2 ± 0.98 √n, a binomial's
    normal approximation) no wider than that. Few samples never are."""
    n = len(samples)
    if n < 8:
        return False
    s = sorted(samples)
    half = 0.98 * math.sqrt(n)
    lo, hi = max(math.floor(n / 2 - half) - 1, 0), min(math.ceil(n / 2 + half), n - 1)
    return (s[hi] - s[lo]) / 2 <= precision * statistics.median(s)


def _summary(samples: list[float], graphed: bool = False) -> Timing:
    samples = sorted(samples)
    q = statistics.quantiles(samples, n=4) if len(samples) >= 2 else [samples[0]] * 3
    return Timing(median_us=statistics.median(samples), spread_us=q[2] - q[0], min_us=samples[0], reps=len(samples),
                  graphed=graphed)


class Repetitions:
    """One call's timed repetitions, made ready once (warmed up, its GPU time estimated) and taken
    in parts that pool: a search's probe takes the first few, its timing the rest, from the same
    captured graph (`take(..., graph=True)`), so that a variant that goes on pays one warm-up, one
    estimate and one capture."""

    def __init__(self, fn: Callable[[], object], flush: L2Flush | None = None, warmup: int = 3):
        import torch

        self.fn, self.flush = fn, flush or L2Flush()
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        # One call's estimate sizes the repetitions (between syncs, so that a slow kernel does not
        # run thousands of times) and the head starts they need.
        self.estimate = _estimate(fn)
        self.samples: list[float] = []
        self._captured: tuple | None | bool = False  # False: not tried; None: cannot be captured

    def count(self, min_reps: int = 50, budget_ms: float = 25.0, max_reps: int = 2000) -> int:
        """Repetitions for at least `min_reps` and `budget_ms` of measured time, at most `max_reps`."""
        return int(min(max_reps, max(min_reps, budget_ms * 1000.0 / self.estimate.gpu_us)))

    def take(self, reps: int, graph: bool = False) -> Timing:
        """`reps` more repetitions (with `graph`, replayed from a chunk captured the first time,
        where the call can be captured); the timing of all taken so far."""
        if reps > 0:
            if graph and self._captured is False:
                self._captured = graphs.capture(self.fn, self.flush, GRAPH_CHUNK)
            if graph and self._captured:
                self.samples += graphs.replay(self._captured, reps)
            else:
                self.samples += _samples(self.fn, self.flush, reps, self.estimate)
        return _summary(self.samples, graphed=bool(self._captured))

    def take_until(self, precision: float | None = None, min_reps: int = 50, budget_ms: float = 25.0,
                   max_reps: int = 2000, graph: bool = False) -> Timing:
        """Repetitions up to `count(min_reps, budget_ms, max_reps)` in all; with `precision`, a
        chunk at a time after `min_reps`, stopping where the median is known within ±precision of
        it (`median_known`): a steady kernel stops early, a noisy one takes its whole count."""
        cap = self.count(min_reps, budget_ms, max_reps)
        if precision is None:
            return self.take(cap - len(self.samples), graph=graph)
        timed = self.take(min(min_reps, cap) - len(self.samples), graph=graph)
        while len(self.samples) < cap and not median_known(self.samples, precision):
            timed = self.take(min(GRAPH_CHUNK, cap - len(self.samples)), graph=graph)
        return timed


def bench(fn: Callable[[], object], *, flush: L2Flush | None = None, warmup: int = 3, min_reps: int = 50,
          budget_ms: float = 25.0, max_reps: int = 2000, graph: bool = False) -> Timing:
    """Time `fn` (GPU time between events around it), flushing L2 before each repetition; with
    `graph`, from replays of a captured chunk of repetitions where `fn` can be captured (and
    more repetitions than a chunk are asked: a capture costs about as many direct ones)."""
    r = Repetitions(fn, flush, warmup)
    reps = r.count(min_reps, budget_ms, max_reps)
    return r.take(reps, graph=graph and reps > GRAPH_CHUNK)


def interleaved(fns: dict[str, Callable[[], object]], *, flush: L2Flush | None = None, rounds: int = 20,
                samples: dict[str, list[float]] | None = None, min_reps: int = 50,
                budget_ms: float | None = None) -> dict[str, Timing]:
    """Time several candidates in turns (A, B, C, A, B, C, ...) so that drift in clocks or
    temperature hits all alike; returns each one's median over all its repetitions. `samples`
    (name -> µs) keeps them: a later call with it adds to them (an extra round for the close).
    Each candidate gets `min_reps` repetitions, or with `budget_ms` fewer where those would take
    longer on the GPU (at least 5 a round): 400 repetitions of EmbeddingBag's backward and of the
    torch baselines' slow calls were most of its search's end, where a 10 µs kernel's 400 are 4 ms."""
    import torch

    flush = flush or L2Flush()
    samples = {} if samples is None else samples
    for name in fns:
        samples.setdefault(name, [])
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    estimates = {name: _estimate(fn) for name, fn in fns.items()}

    def reps(e: _Estimate) -> int:  # a candidate's repetitions
        return min_reps if budget_ms is None else min(min_reps, max(int(budget_ms * 1000.0 / e.gpu_us), 5 * rounds))

    per_round = {name: max(reps(e) // rounds, 1) for name, e in estimates.items()}
    for _ in range(rounds):  # a round: each candidate's repetitions in turn, then one sync
        pairs = _queue([(name, fn) for name, fn in fns.items() for _ in range(per_round[name])], flush, estimates)
        torch.cuda.synchronize()
        for name in fns:
            samples[name].extend(_elapsed(pairs[name]))
    return {name: _summary(samples[name]) for name in fns}


def gradient_call(outputs, inputs, grads) -> Callable[[], object]:
    """A call that computes the gradients of `inputs` for `outputs`' gradients `grads`, the graph
    kept for the next call: a baseline's timed backward, as `torch.autograd.grad(outputs, inputs,
    grads, retain_graph=True)` runs it less its check of the gradients' shapes (made once, here).
    That check imports sympy the first time, hundreds of modules: 0.3 s with their bytecode, 2.3 s
    without, in the middle of a search's finalists."""
    import torch

    outputs, inputs, grads = tuple(outputs), tuple(inputs), tuple(grads)
    for out, grad in zip(outputs, grads, strict=True):
        if out.shape != grad.shape:
            raise ValueError(f"a gradient of shape {tuple(grad.shape)} for an output of shape {tuple(out.shape)}")
    run = getattr(torch.autograd.graph, "_engine_run_backward", None)  # autograd.grad's own engine call
    if run is None:
        return lambda: torch.autograd.grad(outputs, inputs, grads, retain_graph=True)
    return lambda: run(outputs, grads, True, False, inputs, False, accumulate_grad=False)
