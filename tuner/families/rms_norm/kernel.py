"""A built RMSNorm variant, called directly through its C table (templates/rms_norm/rms_norm_abi.h)."""

from __future__ import annotations

import ctypes

from tuner.measure import abi
from tuner.measure.kernel import TORCH_DTYPES, Kernel, dtype_name, launched, stream

Args = abi.struct("rms_norm", "TunerRmsNormArgs")  # mirrors of the header's structs
BackwardArgs = abi.struct("rms_norm", "TunerRmsNormBackwardArgs")


class RmsNormKernel(Kernel):
    family = "rms_norm"

    def _check(self, x, weight) -> None:
        """What the variant takes: its dtypes, a contiguous [rows, width] x and [width] weight on one GPU."""
        got = (dtype_name(x), dtype_name(weight))
        want = (TORCH_DTYPES[self.x_dtype], TORCH_DTYPES[self.weight_dtype])
        if got != want or x.dim() != 2 or weight.shape != (x.shape[1],) or not (x.is_contiguous() and
                                                                             weight.is_contiguous()):
            raise ValueError(f"rms_norm: variant {self.name} takes contiguous x [rows, width] {want[0]} and weight "
                             f"[width] {want[1]}; got {tuple(x.shape)} {got[0]} and {tuple(weight.shape)} {got[1]}")

    def prepare(self, x, weight, eps: float, y=None, rstd=None):
        """(call, y, rstd): `call()` runs the forward of x [rows, width] into y and rstd."""
        import torch

        self._check(x, weight)
        y = torch.empty_like(x) if y is None else y
        rstd = torch.empty(x.shape[0], device=x.device, dtype=torch.float32) if rstd is None else rstd
        args = Args(x.data_ptr(), weight.data_ptr(), y.data_ptr(), rstd.data_ptr(), x.shape[0], x.shape[1], eps)
        forward, pointer, device = self.forward_fn, ctypes.addressof(args), x.device.index
        keep = (x, weight, y, rstd, args)  # what the pointers point into lives as long as the call

        def call():
            launched(forward(pointer, stream(device)), self, "forward")
            return keep

        return call, y, rstd

    def prepare_backward(self, grad, x, weight, rstd, eps: float, grad_x=None, grad_weight=None):
        """(call, grad_x, grad_weight) after a forward that wrote rstd."""
        import torch

        self._check(x, weight)
        grad_x = torch.empty_like(x) if grad_x is None else grad_x
        grad_weight = torch.empty_like(weight) if grad_weight is None else grad_weight
        rows, width = x.shape
        scratch = torch.empty(max(int(self.scratch_floats_fn(rows, width)), 1), device=x.device, dtype=torch.float32)
        grad = grad.contiguous()
        args = BackwardArgs(grad.data_ptr(), x.data_ptr(), weight.data_ptr(), rstd.data_ptr() if self.saves_rstd else None,
                            grad_x.data_ptr() if grad_x.numel() else None,
                            grad_weight.data_ptr() if grad_weight.numel() else None,
                            scratch.data_ptr(), rows, width, eps)
        backward, pointer, device = self.backward_fn, ctypes.addressof(args), x.device.index
        keep = (grad, x, weight, rstd, grad_x, grad_weight, scratch, args)

        def call():
            launched(backward(pointer, stream(device)), self, "backward")
            return keep

        return call, grad_x, grad_weight
