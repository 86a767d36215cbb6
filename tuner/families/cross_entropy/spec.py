"""Cross-entropy's dtypes and float64 reference (torch alone: exported wheels carry this file)."""

from __future__ import annotations

DTYPES = ("float32", "float16", "bfloat16")  # the logits'
REDUCTIONS = ("none", "mean", "sum")
BAD_TARGET = "a target is outside [0, vocab) and is not ignore_index"  # what the kernels report


def reference(logits, target, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
              in_place: bool = False):
    """F.cross_entropy over the last dimension in float64 (`in_place` changes no value). A target outside
    the vocabulary is the op's error (its guard: the CPU op refuses it), not the reference's."""
    import torch.nn.functional as F

    return F.cross_entropy(logits.double(), target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
