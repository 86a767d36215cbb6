"""A built EmbeddingBag variant, called directly through its C table
(templates/embedding_bag/embedding_bag_abi.h) as the family's op calls it: the same scratch, split
and sorting (templates/embedding_bag/embedding_bag_op.cpp's run_forward and run_backward)."""

from __future__ import annotations

import ctypes

from tuner.families.embedding_bag.op import MODE_CODES
from tuner.measure import abi
from tuner.measure.kernel import CHECK as _CHECK
from tuner.measure.kernel import TORCH_DTYPES, Kernel, dtype_name, launched, stream

Args = abi.struct("embedding_bag", "TunerEmbeddingBagArgs")  # mirrors of the header's structs
BackwardArgs = abi.struct("embedding_bag", "TunerEmbeddingBagBackwardArgs")


MAX_SPLITS = 4096


def splits(chunk: int, bags: int, n: int) -> int:
    """Groups per bag for a variant that cuts bags into chunks of `chunk` entries (as the op does)."""
    longest = 2 * n // bags + 1
    return max(1, min(-(-longest // chunk), MAX_SPLITS))


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
    error_text = {1: "an index is outside [0, num_embeddings)",
                  2: "offsets decrease or fall outside [0, len(indices)]"}

    def _check(self, weight, indices, offsets) -> None:
        """What the variant takes: its dtypes, a contiguous 2-D weight aligned for its loads, one GPU."""
        want = (TORCH_DTYPES[self.weight_dtype], TORCH_DTYPES[self.index_dtype], TORCH_DTYPES[self.index_dtype])
        got = tuple(dtype_name(t) for t in (weight, indices, offsets))
        if got != want or weight.dim() != 2 or not weight.is_cuda or len({weight.device, indices.device,
                                                                           offsets.device}) != 1:
            raise ValueError(f"embedding_bag: variant {self.name} takes weight, indices and offsets of {want} on one "
                             f"GPU; got {got}")
        if weight.data_ptr() % (self.vec * weight.element_size()):
            raise ValueError(f"embedding_bag: weight must be aligned to {self.vec * weight.element_size()} bytes "
                             f"for variant {self.name}")

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
        self._check(weight, indices, offsets)
        n = indices.numel()
        args = Args(weight.data_ptr(), indices.data_ptr(), offsets.data_ptr(), None if psw is None else psw.data_ptr(),
                    out.data_ptr(), saved["max_indices"].data_ptr() if code == 2 and saved["max_indices"].numel() else None,
                    saved["bag_count"].data_ptr() if saved["bag_count"].numel() else None,
                    weight.shape[0], dim, bags, n, -1, 1, code, saved["padding_idx"])
        args.splits = splits(self.split, bags, n) if self.split > 0 and bags > 0 else 1
        scratch = None
        if args.splits > 1:
            # One allocation for the chunks' partials: sums (float), then counts and, for max, rows (int64).
            slots = bags * args.splits
            sums = (slots * dim * 4 + 15) // 16 * 16
            scratch = torch.empty(sums + slots * 8 + (slots * dim * 8 if code == 2 else 0), dtype=torch.uint8,
                                  device=weight.device)
            base = scratch.data_ptr()
            args.partials, args.partial_counts = base, base + sums
            args.partial_args = base + sums + slots * 8 if code == 2 else None
        ws = self.workspace(1 + bags if args.splits > 1 else 1, weight.device)
        args.error_word = ws.data_ptr()
        args.arrivals = ws.data_ptr() + 4 if args.splits > 1 else None
        forward, pointer, device = self.forward_fn, ctypes.addressof(args), weight.device.index
        sync = self.validates and _CHECK[check] == "sync"
        keep = (args, scratch, ws, saved)

        def call():
            launched(forward(pointer, stream(device)), self, "forward")
            if sync:
                self.raise_errors()
            return keep

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
        indices, n, dim = saved["indices"], saved["indices"].numel(), w.shape[1]
        if grad.data_ptr() % (self.vec * grad.element_size()):
            grad = grad.clone()
        code, bags = saved["mode"], saved["offsets"].numel() - 1
        psw = saved["psw"]
        args = BackwardArgs(grad.data_ptr(), w.data_ptr(), indices.data_ptr(), saved["offsets"].data_ptr(),
                            None if psw is None else psw.data_ptr(),
                            saved["max_indices"].data_ptr() if code == 2 else None,
                            saved["bag_count"].data_ptr() if code == 1 else None, None, None, None, None,
                            grad_weight.data_ptr(), grad_psw.data_ptr() if grad_psw.numel() else None,
                            w.shape[0], dim, bags, n, -1, 1, code, saved["padding_idx"])
        backward, pointer, device = self.backward_fn, ctypes.addressof(args), w.device.index
        sort = bool(self.sorted and n > 0)
        pieces = -(-n // max(self.piece, 1))

        def call():
            scratch = None
            if sort:  # as the op does on every call: the entries sorted by row, and the scratch
                rows, order = torch.sort(indices.view(-1).to(torch.int64), stable=True)
                bag_of = torch.full((n,), -1, dtype=torch.int64, device=w.device)  # before the first offset: no bag
                partials = torch.empty(pieces, dim, dtype=torch.float32, device=w.device)
                args.sorted_rows, args.order, args.bag_of, args.partials = (
                    rows.data_ptr(), order.data_ptr(), bag_of.data_ptr(), partials.data_ptr())
                scratch = (rows, order, bag_of, partials)
            launched(backward(pointer, stream(device)), self, "backward")
            return scratch, grad, grad_weight, grad_psw, saved

        return call, grad_weight, grad_psw if grad_psw.numel() else None

    def backward(self, saved: dict, grad, *, psw_grad: bool = False):
        """(grad_weight, grad_per_sample_weights or None), torch's dense gradient."""
        call, grad_weight, grad_psw = self.prepare_backward(saved, grad, psw_grad=psw_grad)
        call()
        return grad_weight, grad_psw

