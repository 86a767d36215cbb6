"""What the GIoU op means, in torch alone: its dtypes and reductions, and the float64 reference.

The op's runtime side (tuner/families/giou/op.py) and a wheel of an export use this module
without the rest of tuner, so it imports nothing but torch.
"""

from __future__ import annotations

PRED_DTYPES = ("float32", "float16", "bfloat16")
TARGET_DTYPES = ("uint8", "float16", "bfloat16", "float32")
REDUCTIONS = ("none", "mean", "sum")
DEFAULT_EPS = 1e-7


def valid_mask(target, num_boxes=None):
    """[B, S] bool: which slots hold a real box."""
    import torch

    B, S = target.shape[:2]
    if num_boxes is not None:
        counts = num_boxes.to(device=target.device, dtype=torch.int64).clamp(0, S)
        return torch.arange(S, device=target.device)[None, :] < counts[:, None]
    return target[..., 3] > 0


def giou_loss_elementwise(p, t, eps: float = DEFAULT_EPS):
    """1 - GIoU per box, written as torchvision writes it (so ties split gradients alike)."""
    import torch

    x1, y1, x2, y2 = p.unbind(-1)
    x1g, y1g, x2g, y2g = t.unbind(-1)
    xkis1, ykis1 = torch.max(x1, x1g), torch.max(y1, y1g)
    xkis2, ykis2 = torch.min(x2, x2g), torch.min(y2, y2g)
    mask = (ykis2 > ykis1) & (xkis2 > xkis1)
    inter = torch.where(mask, (xkis2 - xkis1) * (ykis2 - ykis1), torch.zeros_like(x1))
    union = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter
    iou = inter / (union + eps)
    area_c = (torch.max(x2, x2g) - torch.min(x1, x1g)) * (torch.max(y2, y2g) - torch.min(y1, y1g))
    return 1 - (iou - (area_c - union) / (area_c + eps))


def reference(pred, target, num_boxes=None, reduction: str = "mean", eps: float = DEFAULT_EPS):
    """The op's meaning in float64 PyTorch; differentiable with respect to `pred`.

    Padding slots are replaced by a unit box before the math, so that whatever they
    hold (NaN included) reaches neither the loss nor the gradient.
    """
    import torch

    return _loss(pred, target, num_boxes, reduction, eps, torch.float64)


def eager(pred, target, num_boxes=None, reduction: str = "mean", eps: float = DEFAULT_EPS):
    """The same in float32: the eager loss the op replaces, its baseline (the declaration's C++ computes it
    with the same ATen ops where it serves a call)."""
    import torch

    return _loss(pred, target, num_boxes, reduction, eps, torch.float32)


def _loss(pred, target, num_boxes, reduction: str, eps: float, dtype):
    import torch

    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    valid = valid_mask(target, num_boxes)
    p = pred.to(dtype)
    t = target.to(dtype)
    unit = (torch.arange(4, device=p.device) >= 2).to(dtype)  # [0, 0, 1, 1], made on the device
    p = torch.where(valid[..., None], p, unit)
    t = torch.where(valid[..., None], t, unit)
    loss = torch.where(valid, giou_loss_elementwise(p, t, eps), torch.zeros((), dtype=dtype, device=p.device))
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / valid.sum().clamp(min=1)
