"""Linear cross-entropy's dtypes and float64 reference (torch alone: exported wheels carry this file)."""

from __future__ import annotations

DTYPES = ("float32", "float16", "bfloat16")  # hidden's, and the weight's (the same)
REDUCTIONS = ("none", "mean", "sum")
BAD_TARGET = "a target is outside [0, vocab) and is not ignore_index"  # what the kernels report
REFERENCE_ROWS = 1024  # the reference's chunk of rows: its float64 logits never all at once


def reference(hidden, weight, target, ignore_index: int = -100, label_smoothing: float = 0.0,
              reduction: str = "mean"):
    """cross_entropy(hidden @ weight.T, target) in float64, a chunk of rows at a time (each chunk's
    logits recomputed in its backward: the whole [tokens, vocab] never held); differentiable in
    hidden and weight. A target outside the vocabulary is the op's error (its guard), not the reference's."""
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    h, w = hidden.double(), weight.double()

    def rows(h_part, w_, t_part):  # each row's loss, summed into the reduction below
        return F.cross_entropy(h_part @ w_.T, t_part, ignore_index=ignore_index, reduction="none",
                               label_smoothing=label_smoothing)

    parts = [checkpoint(rows, h[i:i + REFERENCE_ROWS], w, target[i:i + REFERENCE_ROWS], use_reentrant=False)
             if torch.is_grad_enabled() else rows(h[i:i + REFERENCE_ROWS], w, target[i:i + REFERENCE_ROWS])
             for i in range(0, h.shape[0], REFERENCE_ROWS)]
    loss = torch.cat(parts) if parts else h.new_zeros(0)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (target != ignore_index).sum()  # a mean over no row is NaN, as torch's
