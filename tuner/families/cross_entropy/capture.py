"""Which torch calls of a training run cross-entropy tunes (tuner.capture; the op's own calls are
read by its declaration): F.cross_entropy of 2-D logits with class indices and no class weights."""

from __future__ import annotations

from tuner import opspec
from tuner.families.cross_entropy.op import OP_DECLARATION, served


def _functional(*args, **kwargs) -> dict | None:
    call, names = served(*args, **kwargs), ("logits", "target", "ignore_index", "label_smoothing", "reduction")
    return None if call is None else opspec.problem(OP_DECLARATION, dict(zip(names, call)),
                                                     ("label_smoothing", "reduction"))


CALLS = {"torch.nn.functional.cross_entropy": lambda args, kwargs: _functional(*args, **kwargs)}
