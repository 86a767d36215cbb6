"""How close a variant's output is to the float64 reference: the norm-wise relative error, and
a tolerance that allows for rounding the exact answer to the output's dtype."""

from __future__ import annotations

import math


# Elements a step of the norms takes: float64 temporaries of 128 MiB, not of the whole output (a
# 16384 x 128256 gradient is 16 GiB in float64, twice over for a difference).
CHUNK = 1 << 24


def _errors(got, want, dtype=None) -> tuple[float, float]:
    """(||got - want|| / ||want||, inf where got is NaN/inf where want is finite or the other way
    round; the same for want rounded to `dtype`, or 0), in float64 over chunks, with one copy to
    the host. Where the reference itself is NaN/inf (a mean over no element), got must be too."""
    import torch

    if got.shape != want.shape:
        return math.inf, 0.0
    g, w = got.detach().reshape(-1), want.detach().reshape(-1)
    totals = torch.zeros(4, dtype=torch.float64, device=w.device)
    for i in range(0, w.numel(), CHUNK):
        a = g[i:i + CHUNK].to(device=w.device, dtype=torch.float64)
        b = w[i:i + CHUNK].to(torch.float64)
        finite, got_finite = torch.isfinite(b), torch.isfinite(a)
        a, b = torch.where(finite, a, 0.0), torch.where(finite, b, 0.0)  # (a NaN of both compares as agreeing)
        r = b.to(dtype).to(torch.float64) - b if dtype is not None else torch.zeros((), dtype=torch.float64, device=w.device)
        totals += torch.stack([(got_finite != finite).sum().double(),
                               b.square().sum(), (a - b).square().sum(), r.square().sum()])
    bad, scale, diff, rounding = (math.sqrt(v) if k else v for k, v in enumerate(totals.tolist()))
    if bad:
        return math.inf, 0.0
    return (diff / scale if scale > 0 else diff), (rounding / scale if scale > 0 else rounding)


def relative_error(got, want) -> float:
    """||got - want|| / ||want||, inf when got has NaN/inf where want is finite (or is finite where want is not)."""
    return _errors(got, want)[0]


def check(name: str, got, want, tol: float, dtype=None) -> tuple[bool, float, str]:
    """Relative error within `tol`; with `dtype`, the error that rounding the exact result to
    that dtype makes (twice over) is allowed on top: e.g. float16 gradients of a mean over
    thousands of elements are subnormal, and no kernel can store them more exactly.
    """
    err, rounding = _errors(got, want, dtype)
    tol += 2 * rounding
    ok = err <= tol
    msg = f"{name}: relative error {err:.3g} (tolerance {tol:.3g})"
    return ok, err, msg
