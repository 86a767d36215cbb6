"""A built GIoU variant, called directly through its C table (the structs of giou_abi.h, rendered
from the op's declaration: `python -m tuner.build.declared giou`)."""

from __future__ import annotations

import ctypes

from tuner.families.giou import DEFAULT_EPS, OP_DECLARATION, REDUCTIONS
from tuner.measure import abi
from tuner.measure.kernel import CHECK as _CHECK
from tuner.measure.kernel import TORCH_DTYPES, Kernel, dtype_name, launched, stream

Args = abi.struct("giou", OP_DECLARATION.structs["args"])  # mirrors of the header's structs
BackwardArgs = abi.struct("giou", OP_DECLARATION.structs["bwd_args"])


class GiouKernel(Kernel):
    """Forward and backward of one compiled variant.

    Bad input (validation's error bits) is reported by `check`:
      "sync" (or True)  read the error word after the launch (a 4-byte copy, so a sync) and raise;
      "deferred" (or False)  leave it in the workspace until `take_errors()` (the search's way).
    (The exported op adds "async", which needs no sync: runtime.bind's `validate`.)
    """

    family = "giou"
    error_text = OP_DECLARATION.error_text

    def _ready(self, t, dtype: str, what: str):
        """Contiguous [B, S, 4] of the variant's dtype, aligned for its loads (a copy only when needed)."""
        got = dtype_name(t)
        if got != TORCH_DTYPES[dtype] or t.dim() != 3 or t.shape[2] != 4 or not t.is_cuda:
            raise ValueError(f"giou_loss: variant {self.name} takes {what} [B, S, 4] {TORCH_DTYPES[dtype]} on a GPU, "
                             f"got {tuple(t.shape)} {got} on {t.device}")
        t = t.contiguous()
        if t.data_ptr() % self.alignment:
            t = t.clone()
        return t

    def _common(self, cls, pred, target, num_boxes, reduction: str, eps: float):
        """(args with the fields both calls share, pred, target, num_boxes) as the variant takes them."""
        import torch

        pred, target = self._ready(pred, self.pred_dtype, "pred"), self._ready(target, self.target_dtype, "target")
        if target.shape != pred.shape:
            raise ValueError(f"giou_loss: pred {tuple(pred.shape)} and target {tuple(target.shape)} must have the same shape")
        if num_boxes is not None:
            num_boxes = num_boxes.to(device=pred.device, dtype=torch.int64).contiguous()
            if num_boxes.shape != (pred.shape[0],):
                raise ValueError(f"giou_loss: num_boxes must have shape [B] = [{pred.shape[0]}]")
        args = cls(pred=pred.data_ptr(), target=target.data_ptr(),
                   num_boxes=None if num_boxes is None else num_boxes.data_ptr(), batch=pred.shape[0],
                   slots=pred.shape[1], reduction=_reduction_code(reduction), eps=eps)
        return args, pred, target, num_boxes

    def prepare(self, pred, target, num_boxes=None, reduction: str = "mean", eps: float = DEFAULT_EPS, *,
                need_grad: bool = False, out=None, count=None, saved_grad=None):
        """(call, loss, count, saved_grad): `call()` runs the forward into them, its arguments
        checked and laid out once (a timed call is the launch alone); saved_grad is empty unless
        a fused variant saves it."""
        import torch

        code = _reduction_code(reduction)
        args, pred, target, num_boxes = self._common(Args, pred, target, num_boxes, reduction, eps)
        B, S = pred.shape[0], pred.shape[1]
        f32 = dict(device=pred.device, dtype=torch.float32)
        if out is None:
            out = torch.empty((B, S) if code == 0 else (), **f32)
        if count is None:
            count = torch.empty((), **f32)
        if saved_grad is None:
            saved_grad = torch.empty(pred.shape if need_grad and self.saves_grad else (0,), **f32)
        if B * S == 0:  # nothing to launch: an empty mean or sum is 0
            def call():
                out.zero_()
                count.zero_()
            return call, out, count, saved_grad
        ws = self.workspace(1 + self.workspace_words_fn(B, S), pred.device)  # the error word, then the variant's
        args.loss, args.count = out.data_ptr(), count.data_ptr()
        args.errors, args.workspace = ws.data_ptr(), ws.data_ptr() + 4
        args.saved_grad = saved_grad.data_ptr() if saved_grad.numel() else None
        forward, pointer, device = self.forward_fn, ctypes.addressof(args), pred.device.index
        keep = (pred, target, num_boxes, out, count, saved_grad, ws, args)  # what the pointers point into

        def call():
            launched(forward(pointer, stream(device)), self, "forward")
            return keep

        return call, out, count, saved_grad

    def forward(self, pred, target, num_boxes=None, reduction: str = "mean", eps: float = DEFAULT_EPS, *,
                need_grad: bool = False, check: bool | str = True, out=None, count=None, saved_grad=None):
        """Returns (loss, count, saved_grad); saved_grad is empty unless a fused variant saves it."""
        import torch

        call, out, count, saved_grad = self.prepare(pred, target, num_boxes, reduction, eps, need_grad=need_grad,
                                                    out=out, count=count, saved_grad=saved_grad)
        call()
        if self.validates and _CHECK[check] == "sync" and not torch.cuda.is_current_stream_capturing():
            self.raise_errors()
        return out, count, saved_grad

    def prepare_backward(self, grad_out, pred, target, num_boxes, count, saved_grad, reduction: str = "mean",
                         eps: float = DEFAULT_EPS, grad_pred=None):
        """(call, grad_pred): `call()` runs the backward into grad_pred, its arguments laid out once."""
        import torch

        args, pred, target, num_boxes = self._common(BackwardArgs, pred, target, num_boxes, reduction, eps)
        grad_out = grad_out.to(torch.float32).contiguous()
        if grad_pred is None:
            grad_pred = torch.empty_like(pred)
        if pred.numel() == 0:
            return (lambda: None), grad_pred
        if self.saves_grad and saved_grad.numel() != pred.numel():
            raise ValueError(f"giou_loss: variant {self.name} needs the gradient its forward saves (need_grad=True)")
        args.grad_loss, args.count, args.grad_pred = grad_out.data_ptr(), count.data_ptr(), grad_pred.data_ptr()
        args.saved_grad = saved_grad.data_ptr() if self.saves_grad else None
        backward, pointer, device = self.backward_fn, ctypes.addressof(args), pred.device.index
        keep = (grad_out, pred, target, num_boxes, count, saved_grad, grad_pred, args)

        def call():
            launched(backward(pointer, stream(device)), self, "backward")
            return keep

        return call, grad_pred

    def backward(self, grad_out, pred, target, num_boxes, count, saved_grad, reduction: str = "mean",
                 eps: float = DEFAULT_EPS, grad_pred=None):
        call, grad_pred = self.prepare_backward(grad_out, pred, target, num_boxes, count, saved_grad, reduction,
                                                eps, grad_pred)
        call()
        return grad_pred


def _reduction_code(reduction: str) -> int:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return REDUCTIONS.index(reduction)
