"""Which calls of a training run RMSNorm tunes, as its Problem (tuner.capture): F.rms_norm (what
nn.RMSNorm calls) over the last dimension with a weight, and the tuned op itself. Other calls
(several normalized dimensions, no weight, float64) are not this family's: None."""

from __future__ import annotations

import math

from tuner.deploy.capturing import dtype_of
from tuner.families.rms_norm.spec import DEFAULT_EPS, DTYPES


def _problem(x, weight) -> dict | None:
    if weight is None or x.dim() < 1 or weight.dim() != 1 or weight.shape[0] != x.shape[-1] or x.numel() == 0:
        return None
    if dtype_of(x) not in DTYPES or dtype_of(weight) not in DTYPES:
        return None
    return {"rows": math.prod(x.shape[:-1]), "width": x.shape[-1], "x": dtype_of(x), "weight": dtype_of(weight)}


def _functional(input, normalized_shape, weight=None, eps=None) -> dict | None:
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if weight is None or len(shape) != 1 or input.dim() < 1 or shape[0] != input.shape[-1]:
        return None
    return _problem(input, weight)


def _op(x, weight=None, eps=DEFAULT_EPS) -> dict | None:
    return _problem(x, weight)


CALLS = {
    "torch.nn.functional.rms_norm": lambda args, kwargs: _functional(*args, **kwargs),
    "tuner::rms_norm": lambda args, kwargs: _op(*args, **kwargs),
}
