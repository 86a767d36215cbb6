"""Which torch calls of a training run cross-entropy tunes (tuner.capture; the op's own calls are
read by its declaration): F.cross_entropy of 2-D logits with class indices and no class weights."""

from __future__ import annotations

from tuner import opspec
from tuner.families.cross_entropy.op import OP_DECLARATION, served


def _functional(*args, **kwargs) -> dict | None:
    call = served(*args, **kwargs)
    if call is None:
        return None
    values = dict(zip(("logits", "target", "ignore_index", "label_smoothing", "reduction"), call))
    return opspec.problem(OP_DECLARATION, values, ("label_smoothing", "reduction"))


CALLS = {"torch.nn.functional.cross_entropy": lambda args, kwargs: _functional(*args, **kwargs)}
