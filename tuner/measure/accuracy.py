"""How close a variant's output is to the float64 reference: the norm-wise relative error, and
a tolerance that allows for rounding the exact answer to the output's dtype."""

from __future__ import annotations

import math


def relative_error(got, want) -> float:
    """||got - want|| / ||want||, inf when got has NaN/inf where want is finite."""
    import torch

    if got.shape != want.shape:
        return math.inf
    got = got.detach().to(device=want.device, dtype=torch.float64)
    want = want.detach().to(torch.float64)
    # one copy to the host for all three numbers (the tensors stay where they are)
    finite, scale, diff = torch.stack([torch.isfinite(got).all().double(), want.norm(), (got - want).norm()]).tolist()
    if not finite:
        return math.inf
    return diff / scale if scale > 0 else diff


def check(name: str, got, want, tol: float, dtype=None) -> tuple[bool, float, str]:
    """Relative error within `tol`; with `dtype`, the error that rounding the exact result to
    that dtype makes (twice over) is allowed on top: e.g. float16 gradients of a mean over
    thousands of elements are subnormal, and no kernel can store them more exactly.
    """
    err = relative_error(got, want)
    if dtype is not None:
        tol += 2 * relative_error(want.to(dtype), want)
    ok = err <= tol
    msg = f"{name}: relative error {err:.3g} (tolerance {tol:.3g})"
    return ok, err, msg
