"""RMSNorm's dtypes and float64 reference (torch alone: exported wheels carry this file)."""

from __future__ import annotations

DTYPES = ("float32", "float16", "bfloat16")  # x and weight, each
DEFAULT_EPS = 1e-6


def rstd(x, eps: float = DEFAULT_EPS):
    """1 / rms of each row of x (the last dimension), float64."""
    import torch

    return torch.rsqrt(x.double().pow(2).mean(-1) + eps)


def reference(x, weight, eps: float = DEFAULT_EPS):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension, in float64."""
    return x.double() * rstd(x, eps)[..., None] * weight.double()


def reference_backward(x, weight, grad, eps: float = DEFAULT_EPS):
    """(grad of x, grad of weight) in float64 for the output gradient `grad`."""
    import torch

    with torch.enable_grad():
        x64 = x.detach().double().requires_grad_()
        w64 = weight.detach().double().requires_grad_()
        # of the sum: autograd's check of a grad_outputs tensor imports sympy (0.3-2.4 s of a
        # worker's start, where the first check case waits)
        return torch.autograd.grad((reference(x64, w64, eps) * grad.double()).sum(), (x64, w64))
