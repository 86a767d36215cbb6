"""A built RMSNorm variant, called through the family's binding by its table's address."""

from __future__ import annotations

import ctypes

from tuner.kernel import Kernel


class RmsNormKernel(Kernel):
    family = "rms_norm"
    fields = [("x_dtype", ctypes.c_char_p), ("weight_dtype", ctypes.c_char_p), ("saves_rstd", ctypes.c_int),
              ("forward", ctypes.c_void_p), ("backward", ctypes.c_void_p), ("scratch_floats", ctypes.c_void_p)]

    def prepare(self, x, weight, eps: float, y=None, rstd=None):
        """(call, y, rstd): `call()` runs the forward of x [rows, width] into y and rstd."""
        import torch

        y = torch.empty_like(x) if y is None else y
        rstd = torch.empty(x.shape[0], device=x.device, dtype=torch.float32) if rstd is None else rstd
        forward, address = self.ops.forward, self.address
        return (lambda: forward(address, x, weight, eps, y, rstd)), y, rstd

    def prepare_backward(self, grad, x, weight, rstd, eps: float, grad_x=None, grad_weight=None):
        """(call, grad_x, grad_weight) after a forward that wrote rstd."""
        import torch

        grad_x = torch.empty_like(x) if grad_x is None else grad_x
        grad_weight = torch.empty_like(weight) if grad_weight is None else grad_weight
        scratch = torch.empty(max(int(self.ops.scratch_floats(self.address, x.shape[0], x.shape[1])), 1),
                              device=x.device, dtype=torch.float32)
        backward, address = self.ops.backward, self.address
        return (lambda: backward(address, grad, x, weight, rstd, eps, grad_x, grad_weight, scratch)), grad_x, grad_weight
