"""A built GIoU variant loaded into this process, callable on CUDA tensors."""

from __future__ import annotations

import ctypes

from tuner.errors import KernelInputError
from tuner.families.giou import DEFAULT_EPS, REDUCTIONS
from tuner.kernel import CHECK as _CHECK
from tuner.kernel import Kernel


class GiouKernel(Kernel):
    """Forward and backward of one compiled variant.

    Bad input (validation's error bits) is reported by `check`:
      "sync" (or True)  read the error word after the launch (a 4-byte copy, so a sync) and raise;
      "async"           copy it to pinned memory without waiting; a later call raises it
                        once the copy has landed (no sync, nothing lost; off under graph capture);
      "deferred" (or False)  leave it in the workspace until `take_errors()`.
    """

    family = "giou"
    fields = [("pred_dtype", ctypes.c_char_p), ("target_dtype", ctypes.c_char_p), ("alignment", ctypes.c_int),
              ("saves_grad", ctypes.c_int), ("validates", ctypes.c_int), ("forward", ctypes.c_void_p),
              ("backward", ctypes.c_void_p), ("workspace_words", ctypes.c_void_p)]

    def _ready(self, t):
        """Contiguous and aligned for this variant's loads (a copy only when needed)."""
        t = t.contiguous()
        if t.data_ptr() % self.alignment:
            t = t.clone()
        return t

    def forward(self, pred, target, num_boxes=None, reduction: str = "mean", eps: float = DEFAULT_EPS, *,
                need_grad: bool = False, check: bool | str = True, out=None, count=None, saved_grad=None):
        """Returns (loss, count, saved_grad); saved_grad is empty unless a fused variant saves it."""
        import torch

        code = _reduction_code(reduction)
        pred, target = self._ready(pred), self._ready(target)
        if num_boxes is not None:
            num_boxes = num_boxes.to(torch.int64).contiguous()
        B, S = pred.shape[0], pred.shape[1] if pred.dim() >= 2 else 0
        f32 = dict(device=pred.device, dtype=torch.float32)
        if out is None:
            out = torch.empty((B, S) if code == 0 else (), **f32)
        if count is None:
            count = torch.empty((), **f32)
        if saved_grad is None:
            saved_grad = torch.empty(pred.shape if need_grad and self.saves_grad else (0,), **f32)
        try:
            self.ops.forward(self.address, pred, target, num_boxes, code, eps, out, count, saved_grad,
                             _CHECK[check])
        except ValueError as exc:
            raise KernelInputError(str(exc).split("\n")[0]) from exc
        return out, count, saved_grad

    def backward(self, grad_out, pred, target, num_boxes, count, saved_grad, reduction: str = "mean",
                 eps: float = DEFAULT_EPS, grad_pred=None):
        import torch

        pred, target = self._ready(pred), self._ready(target)
        if num_boxes is not None:
            num_boxes = num_boxes.to(torch.int64).contiguous()
        grad_out = grad_out.to(torch.float32).contiguous()
        if grad_pred is None:
            grad_pred = torch.empty_like(pred)
        self.ops.backward(self.address, grad_out, pred, target, num_boxes, count, saved_grad,
                          _reduction_code(reduction), eps, grad_pred)
        return grad_pred



def _reduction_code(reduction: str) -> int:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return REDUCTIONS.index(reduction)
