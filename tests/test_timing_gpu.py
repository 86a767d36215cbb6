"""The timing function on the GPU: events time the GPU's work whatever the host's pace, with a
head start only where the host would fall behind."""

import time

import pytest

from tuner.measure import graphs, timing

pytestmark = pytest.mark.gpu


@pytest.fixture
def spins(monkeypatch):
    calls = []
    real = timing.head_start

    def counted(us=None):
        if us is not None and us >= timing.SPARE_US:  # a repetition's head start (not an estimate's)
            calls.append(us)
        return real(us)

    monkeypatch.setattr(timing, "head_start", counted)
    return calls


def test_a_call_the_gpu_runs_slower_than_the_host_queues_needs_one_head_start(spins):
    import torch

    src = torch.randn(16 * 1024 * 1024, device="cuda")  # 64 MB: a copy is ~40 µs of HBM traffic
    dst = torch.empty_like(src)
    flush = timing.L2Flush()
    t = timing.bench(lambda: dst.copy_(src), flush=flush, min_reps=192, max_reps=192, budget_ms=0)
    # One head start would do; a few more come where the launch queue fills and the host waits on
    # it (the lead counts the wait as lost), as on a busy host after other tests: 6 seen. A lead
    # that never grew would spin before every repetition (192).
    assert t.reps == 192 and len(spins) <= 16, spins
    # the same copy back to back between one pair of events (each a full HBM pass either way)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        dst.copy_(src)
    end.record()
    end.synchronize()
    alone = start.elapsed_time(end) * 1000.0 / 100
    assert t.median_us == pytest.approx(alone, rel=0.2)


def test_a_call_the_host_queues_slower_than_the_gpu_runs_is_timed_on_the_gpu(spins):
    """200 µs of host work before a tiny kernel: without enough queued ahead, each event pair
    would time the host (>= 200 µs); the median must be the kernel's few µs."""
    import torch

    x = torch.randn(1024, device="cuda")

    def slow_host():
        began = time.perf_counter()
        while time.perf_counter() - began < 200e-6:
            pass
        x.add_(1.0)

    t = timing.bench(slow_host, min_reps=64, max_reps=64, budget_ms=0)
    assert t.median_us < 50.0, t
    assert len(spins) > 3, spins  # the host fell behind: head starts were queued on the way
    rounds = timing.interleaved({"slow": slow_host, "tiny": lambda: x.add_(1.0)}, rounds=4, min_reps=32)
    assert rounds["slow"].median_us < 50.0 and rounds["tiny"].median_us < 50.0
    assert rounds["slow"].reps == rounds["tiny"].reps == 32


def test_interleaved_candidates_slower_than_the_budget_get_fewer_repetitions():
    """The finalists' turns: a 1 ms call gets what `budget_ms` of its GPU time allows (at least 5 a
    round), a fast one all of `min_reps`; both stay interleaved and both are timed right."""
    import torch

    x = torch.randn(1024, device="cuda")
    cycles = 2_000_000  # about 1-2 ms of spinning

    def slow():
        torch.cuda._sleep(cycles)

    got = timing.interleaved({"slow": slow, "fast": lambda: x.add_(1.0)}, rounds=4, min_reps=200, budget_ms=10.0)
    assert got["slow"].reps == 20 and got["fast"].reps == 200, got
    assert got["slow"].median_us > 200.0 > 20.0 > got["fast"].median_us, got
    unbudgeted = timing.interleaved({"slow": slow}, rounds=4, min_reps=40)
    assert unbudgeted["slow"].reps == 40 and unbudgeted["slow"].median_us == pytest.approx(got["slow"].median_us, rel=0.1)


def test_a_graph_times_what_direct_repetitions_time():
    """Replays of a captured chunk time a kernel as the direct repetitions do (same process,
    interleaved runs), and a host's slowness before the call does not count at all."""
    import torch

    src = torch.randn(4 * 1024 * 1024, device="cuda")  # 16 MB: a copy of ~10-15 µs from HBM
    dst = torch.empty_like(src)
    flush = timing.L2Flush()
    direct, graphed = [], []
    for _ in range(3):
        direct.append(timing.bench(lambda: dst.copy_(src), flush=flush, min_reps=96, max_reps=96).median_us)
        graphed.append(timing.bench(lambda: dst.copy_(src), flush=flush, min_reps=96, max_reps=96,
                                    graph=True).median_us)
    assert sorted(graphed)[1] == pytest.approx(sorted(direct)[1], rel=0.15), (direct, graphed)

    def slow_host():
        began = time.perf_counter()
        while time.perf_counter() - began < 200e-6:
            pass
        dst.copy_(src)

    t = timing.bench(slow_host, flush=flush, min_reps=64, max_reps=64, budget_ms=0, graph=True)
    assert t.graphed and t.reps == 64 and t.median_us == pytest.approx(sorted(direct)[1], rel=0.25), t


def test_a_search_times_a_steady_kernel_until_its_median_is_known():
    """`take_until(precision=...)`: a chunk at a time after `min_reps`, stopping once the median is
    known within ±precision; without one, the whole count (as `bench`)."""
    import torch

    src = torch.randn(16 * 1024 * 1024, device="cuda")  # 64 MB: a copy of ~50 µs, steady
    dst = torch.empty_like(src)
    flush = timing.L2Flush()
    steady = timing.Repetitions(lambda: dst.copy_(src), flush=flush)
    t = steady.take_until(precision=0.02, min_reps=16, budget_ms=1000, max_reps=192, graph=True)
    assert t.graphed and 16 <= t.reps < 192 and timing.median_known(steady.samples, 0.02), t
    counted = timing.Repetitions(lambda: dst.copy_(src), flush=flush)
    t = counted.take_until(min_reps=16, budget_ms=1000, max_reps=64, graph=True)
    assert t.reps == 64, t


CANNOT_BE_CAPTURED = r"""
import torch
from tuner.measure import timing

x = torch.randn(1024, device="cuda")
captured = []

def syncs():  # a host read of a result: not allowed while capturing
    x.add_(1.0)
    captured.append(torch.cuda.is_current_stream_capturing())
    return x[0].item()

t = timing.bench(syncs, min_reps=32, max_reps=32, budget_ms=0, graph=True)
assert t.reps == 32 and t.median_us > 0 and not t.graphed, t
assert any(captured), "the capture was never tried"
assert timing.spoiled() and not torch.cuda.is_current_stream_capturing()
torch.randn(16, device="cuda")  # random numbers work (the generator's capture was ended)
again = timing.bench(lambda: x.add_(1.0), min_reps=32, max_reps=32, budget_ms=0, graph=True)
assert again.reps == 32 and not again.graphed  # no second capture in a spoiled process
print("ok")
"""


def test_a_call_that_cannot_be_captured_is_timed_directly():
    """In a process of its own: a failed capture leaves torch's allocator believing a capture is
    under way, and the worker replaces such a process (timing.spoiled)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", CANNOT_BE_CAPTURED], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_graphs_one_after_another_leave_random_numbers_working(monkeypatch):
    """A search times hundreds of variants in one process, each from graphs of its own."""
    import torch

    x = torch.randn(1024, device="cuda")
    captured = []
    real = graphs.capture

    def counted(*args):
        graph = real(*args)
        captured.append(graph is not None)
        return graph

    monkeypatch.setattr(graphs, "capture", counted)
    for _ in range(4):
        timing.bench(lambda: x.mul_(1.0), min_reps=48, max_reps=48, budget_ms=0, graph=True)
        torch.rand(16, device="cuda")
    assert captured == [True] * 4, captured  # every one captured (none fell back)
