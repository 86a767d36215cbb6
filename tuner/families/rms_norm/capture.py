"""Which torch calls of a training run RMSNorm tunes (tuner.capture; the op's own calls are read
by its declaration): F.rms_norm, what nn.RMSNorm calls, over the last dimension with a weight."""

from __future__ import annotations

from tuner import opspec
from tuner.families.rms_norm.op import OP_DECLARATION


def _functional(input, normalized_shape, weight=None, eps=None) -> dict | None:
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if len(shape) != 1 or input.dim() < 1 or shape[0] != input.shape[-1]:
        return None
    return opspec.problem(OP_DECLARATION, {"x": input, "weight": weight, "eps": eps})


CALLS = {"torch.nn.functional.rms_norm": lambda args, kwargs: _functional(*args, **kwargs)}
