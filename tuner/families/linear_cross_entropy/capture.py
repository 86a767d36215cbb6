"""Which calls of a training run linear cross-entropy tunes (tuner.capture): F.cross_entropy of logits that
autograd's graph shows as F.linear's product with no bias, through a loss's views and float32 cast."""

from __future__ import annotations

from tuner.deploy.capturing import dtype_of
from tuner.families.cross_entropy.op import served
from tuner.families.linear_cross_entropy.spec import DTYPES

PASSED = {"ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "ToCopyBackward0"}  # what a loss adds


def _head(logits):
    """(hidden [tokens, H], weight.T) whose mm made `logits` (F.linear without a bias), or None."""
    fn = logits.grad_fn
    while fn is not None and type(fn).__name__ in PASSED:
        fn = fn.next_functions[0][0]
    if fn is None or type(fn).__name__ != "MmBackward0":
        return None
    try:
        hidden, weight_t = fn._saved_self, fn._saved_mat2
    except RuntimeError:  # freed by a backward already
        return None
    if hidden is None or weight_t is None or hidden.dim() != 2 or weight_t.dim() != 2 or weight_t.stride(0) != 1:
        return None  # the weight as F.linear hands it: a [vocab, H] tensor's transpose
    return hidden, weight_t


def _loss(*args, **kwargs) -> dict | None:
    call = served(*args, **kwargs)
    if call is None:
        return None
    logits, target, _, label_smoothing, reduction = call
    head = _head(logits)
    if head is None or dtype_of(head[0]) not in DTYPES or logits.shape != (head[0].shape[0], head[1].shape[1]):
        return None
    hidden, weight_t = head
    return {"tokens": hidden.shape[0], "width": hidden.shape[1], "vocab": weight_t.shape[1], "hidden": dtype_of(hidden),
            "reduction": reduction, "label_smoothing": label_smoothing}


CALLS = {"torch.nn.functional.cross_entropy": lambda args, kwargs: _loss(*args, **kwargs)}
