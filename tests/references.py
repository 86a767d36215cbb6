"""A family's float64 answers in tests: its reference's outputs and gradients, as the search checks
variants against them (tuner.opspec.reference_answers)."""

import torch

from tuner import opspec
from tuner.families.embedding_bag.spec import _counts, _entries, _rows
from tuner.families.embedding_bag.spec import reference as embedding_bag


def with_grad(family, *args, grad_out=None):
    """(the reference's output, the gradient of its first differentiable input) of `family`'s op
    at `args`, for the output's gradient `grad_out` (ones where None)."""
    grad_out = torch.ones(()) if grad_out is None else grad_out  # expanded to the output's shape
    (out,), grads = opspec.reference_answers(family.OP_DECLARATION, family.reference, args, [grad_out])
    return out, grads[0]


def embedding_bag_backward(weight, indices, offsets, mode: str, per_sample_weights, grad_out,
                       include_last_offset: bool = False, padding_idx: int | None = None):
    """float64 gradients of embedding_bag written from segment sums, apart from the autograd of its
    reference that the search checks by: (d weight [rows, dim], d per_sample_weights [n] or None),
    torch's dense gradient (sparse=False); on weight's device."""
    import torch

    w = weight.double()
    g = grad_out.to(w.device, w.dtype)
    idx, offs, bag_of, keep = _entries(indices, offsets, include_last_offset, padding_idx, w.device)
    bags = offs.numel() - 1
    grad_w = torch.zeros_like(w)
    if mode == "max":
        _, chosen = embedding_bag(weight, indices, offsets, mode, None, include_last_offset, padding_idx)
        col = torch.arange(w.shape[1], device=w.device).expand(bags, -1)
        found = chosen >= 0
        grad_w.index_put_((chosen[found], col[found]), g[found], accumulate=True)
        return grad_w, None
    scale = torch.ones(idx.numel(), dtype=torch.float64, device=w.device)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.to(w.device, w.dtype)
    if mode == "mean":
        scale = scale / _counts(bag_of, keep, bags).clamp(min=1)[bag_of]
    grad_w.index_add_(0, idx[keep], g[bag_of[keep]] * scale[keep][:, None])
    grad_psw = None
    if per_sample_weights is not None:
        grad_psw = scale.new_zeros(idx.numel())
        grad_psw[keep] = (_rows(w, idx[keep]) * g[bag_of[keep]]).sum(1)
    return grad_w, grad_psw
