"""RMSNorm's dtypes and float64 reference (torch alone: exported wheels carry this file)."""

from __future__ import annotations

DTYPES = ("float32", "float16", "bfloat16")  # x and weight, each
DEFAULT_EPS = 1e-6


def reference(x, weight, eps: float = DEFAULT_EPS):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dimension, in float64."""
    import torch

    return x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps) * weight.double()
