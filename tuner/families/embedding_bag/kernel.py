"""A built EmbeddingBag variant loaded into this process, called through the family's torch
binding by its C table's address (templates/embedding_bag/embedding_bag_op.cpp)."""

from __future__ import annotations

import ctypes

from tuner.errors import KernelInputError
from tuner.families.embedding_bag.op import MODE_CODES
from tuner.kernel import CHECK as _CHECK
from tuner.kernel import Kernel


def flat(indices, offsets=None, include_last_offset: bool = False):
    """torch's two input forms as the kernels take them: (1-D indices, offsets with the end)."""
    import torch

    if indices.dim() == 2:
        bags, per = indices.shape
        offsets = torch.arange(bags + 1, device=indices.device, dtype=indices.dtype) * per
        return indices.reshape(-1).contiguous(), offsets
    if not include_last_offset:
        offsets = torch.cat([offsets, offsets.new_tensor([indices.numel()])])
    return indices.contiguous(), offsets.to(indices.dtype).contiguous()


class EmbeddingBagKernel(Kernel):
    """Forward and backward of one compiled variant on the current CUDA stream. With check
    "deferred" (the search's), errors the variant's validation finds stay in the binding's
    error word until `take_errors()`; with "sync" the call raises KernelInputError."""

    family = "embedding_bag"
    fields = [("weight_dtype", ctypes.c_char_p), ("index_dtype", ctypes.c_char_p), ("vec", ctypes.c_int),
              ("validates", ctypes.c_int), ("sorted", ctypes.c_int), ("piece", ctypes.c_int),
              ("split", ctypes.c_int),
              ("forward", ctypes.c_void_p), ("backward", ctypes.c_void_p)]

    def forward(self, weight, indices, offsets=None, mode: str = "mean", per_sample_weights=None,
                include_last_offset: bool = False, padding_idx: int | None = None, *, out=None,
                check: bool | str = "deferred"):
        """(out [bags, dim], max_indices or None, bag_count), as F.embedding_bag computes out."""
        call, saved = self.prepare(weight, indices, offsets, mode, per_sample_weights, include_last_offset,
                                   padding_idx, out=out, check=check)
        call()
        return saved["out"], saved["max_indices"] if mode == "max" else None, saved["bag_count"]

    def prepare(self, weight, indices, offsets=None, mode: str = "mean", per_sample_weights=None,
                include_last_offset: bool = False, padding_idx: int | None = None, *, out=None,
                check: bool | str = "deferred"):
        """(call, saved): `call()` launches the forward on these tensors and the current stream with
        nothing else done in Python, as the search times it; `saved` holds what the backward needs."""
        import torch

        indices, offsets = flat(indices, offsets, include_last_offset)
        weight = weight.contiguous()
        psw = per_sample_weights.reshape(-1).contiguous() if per_sample_weights is not None else None
        bags, dim = offsets.numel() - 1, weight.shape[1]
        if out is None:
            out = torch.empty(bags, dim, dtype=weight.dtype, device=weight.device)
        code = MODE_CODES[mode]
        saved = dict(weight=weight, indices=indices, offsets=offsets, mode=code, psw=psw, out=out,
                     padding_idx=-1 if padding_idx is None else padding_idx % max(weight.shape[0], 1),
                     max_indices=torch.empty((bags if mode == "max" else 0, dim), dtype=torch.int64,
                                             device=weight.device),
                     bag_count=torch.empty(bags if mode == "mean" else 0, dtype=torch.float32, device=weight.device))
        forward, address, level = self.ops.forward, self.address, _CHECK[check]

        def call():
            try:
                forward(address, weight, indices, offsets, code, psw, saved["padding_idx"], out,
                        saved["max_indices"], saved["bag_count"], level)
            except ValueError as exc:
                raise KernelInputError(str(exc).split("\n")[0]) from exc

        return call, saved

    def prepare_backward(self, saved: dict, grad, *, psw_grad: bool = False):
        """(call, grad_weight, grad_per_sample_weights or None) after a forward prepared with `saved`.
        The call does not zero grad_weight (the op does): timing repeats it on one buffer."""
        import torch

        w = saved["weight"]
        grad = grad.to(w.dtype).contiguous()
        grad_weight = torch.zeros_like(w)
        grad_psw = torch.empty(saved["indices"].numel() if psw_grad and saved["psw"] is not None else 0,
                               dtype=w.dtype, device=w.device)
        backward, address = self.ops.backward, self.address

        def call():
            backward(address, grad, w, saved["indices"], saved["offsets"], saved["mode"], saved["psw"],
                     saved["padding_idx"], saved["max_indices"], saved["bag_count"], grad_weight, grad_psw)

        return call, grad_weight, grad_psw if grad_psw.numel() else None

    def backward(self, saved: dict, grad, *, psw_grad: bool = False):
        """(grad_weight, grad_per_sample_weights or None), torch's dense gradient."""
        call, grad_weight, grad_psw = self.prepare_backward(saved, grad, psw_grad=psw_grad)
        call()
        return grad_weight, grad_psw

