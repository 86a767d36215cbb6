"""Which calls of a training run the GIoU family tunes, as its Problem (tuner.capture): the tuned
op `tuner::giou_loss` on [B, S, 4] boxes; box counts are taken as the article's distribution.
torchvision.ops.generalized_box_iou_loss is not here: it is a plain Python function that never
reaches torch function handling, so a mode sees only the small ops inside it, not the call."""

from __future__ import annotations

from tuner.deploy.capturing import dtype_of
from tuner.families.giou.spec import DEFAULT_EPS, PRED_DTYPES, REDUCTIONS, TARGET_DTYPES


def _op(pred, target, num_boxes=None, reduction="mean", eps=DEFAULT_EPS) -> dict | None:
    if pred.dim() != 3 or pred.shape[-1] != 4 or target.shape != pred.shape or pred.numel() == 0:
        return None
    if dtype_of(pred) not in PRED_DTYPES or dtype_of(target) not in TARGET_DTYPES or reduction not in REDUCTIONS:
        return None
    return {"batch": pred.shape[0], "slots": pred.shape[1], "pred": dtype_of(pred), "target": dtype_of(target),
            "distribution": "article", "reduction": reduction}


CALLS = {"tuner::giou_loss": lambda args, kwargs: _op(*args, **kwargs)}
