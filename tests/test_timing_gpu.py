"""The timing function on the GPU: events time the GPU's work whatever the host's pace, with a
head start only where the host would fall behind."""

import time

import pytest

from tuner.measure import timing

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
    assert t.reps == 192 and len(spins) <= 2, spins
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
