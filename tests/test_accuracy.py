"""The relative error a variant is checked by: norm-wise, in float64 over chunks, NaN where the
reference is NaN."""

import math

import torch

from tuner.measure import accuracy


def test_chunks_give_the_whole_tensor_s_error(monkeypatch):
    want = torch.randn(1000, 37, dtype=torch.float64)
    got = (want + 1e-3 * torch.randn_like(want)).float()
    whole = ((got.double() - want).norm() / want.norm()).item()
    monkeypatch.setattr(accuracy, "CHUNK", 100)  # 370 chunks, the last one short
    assert math.isclose(accuracy.relative_error(got, want), whole, rel_tol=1e-12)
    rounding = ((want.bfloat16().double() - want).norm() / want.norm()).item()
    ok, err, message = accuracy.check("x", got, want, 1e-3, torch.bfloat16)
    assert ok and math.isclose(err, whole, rel_tol=1e-12) and f"{1e-3 + 2 * rounding:.3g}" in message


def test_a_nan_agrees_only_with_a_nan_of_the_reference():
    nan = float("nan")
    f64 = dict(dtype=torch.float64)
    assert accuracy.check("loss", torch.tensor(nan), torch.tensor(nan, **f64), 1e-5, torch.float32)[0]  # a mean of none
    assert accuracy.relative_error(torch.tensor(0.0), torch.tensor(nan, **f64)) == math.inf
    assert accuracy.relative_error(torch.tensor([1.0, nan]), torch.tensor([1.0, 2.0], **f64)) == math.inf
    # the other elements still count: a NaN of the reference does not excuse them
    assert not accuracy.check("x", torch.tensor([1.0, nan]), torch.tensor([1.1, nan], **f64), 1e-5, torch.float32)[0]
    assert accuracy.relative_error(torch.zeros(0), torch.zeros(0, **f64)) == 0.0
    assert accuracy.relative_error(torch.zeros(3), torch.zeros(2, **f64)) == math.inf
