"""The search's stopping rule for repetitions (`timing.median_known`), on made-up samples: the CPU
part of tuner/measure/timing.py (the GPU's is tests/test_timing_gpu.py)."""

import random

from tuner.measure import timing


def _reps_until_known(spread: float, seed: int, precision: float = 0.01, cap: int = 192) -> int:
    r = random.Random(seed)
    samples: list[float] = []
    while True:
        samples += [8.0 * (1 + r.gauss(0, spread)) for _ in range(timing.GRAPH_CHUNK)]
        if timing.median_known(samples, precision) or len(samples) >= cap:
            return len(samples)


def test_a_steady_kernel_is_known_after_one_chunk_and_a_noisy_one_takes_more():
    steady = [_reps_until_known(0.005, seed) for seed in range(20)]
    spread = [_reps_until_known(0.04, seed) for seed in range(20)]
    noisy = [_reps_until_known(0.10, seed) for seed in range(20)]
    assert max(steady) == timing.GRAPH_CHUNK
    assert 48 <= sorted(spread)[10] <= 160  # ±1% of the median at 95%: ~100 samples of a 4% spread
    assert min(noisy) == 192  # never within 1%: the whole count


def test_few_samples_never_count_as_known_and_the_interval_is_two_sided():
    assert not timing.median_known([5.0] * 7, 0.01)
    assert timing.median_known([5.0] * 8, 0.01)
    # a tenth of the samples far out on either side does not move the median's interval
    assert timing.median_known([5.0] * 90 + [50.0] * 5 + [0.5] * 5, 0.01)
    # samples in two clusters either side of the median do
    assert not timing.median_known([4.0] * 45 + [6.0] * 55, 0.01)
