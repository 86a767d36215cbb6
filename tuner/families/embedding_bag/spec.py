"""What the EmbeddingBag op means, in torch alone: its dtypes and modes, and the float64 reference.

The op's runtime side (tuner/families/embedding_bag/op.py) and a wheel of an export use this
module without the rest of tuner, so it imports nothing but torch.
"""

from __future__ import annotations

WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
INDEX_DTYPES = ("int64", "int32")
MODES = ("sum", "mean", "max")


def reference(weight, indices, offsets=None, mode: str = "mean", per_sample_weights=None,
              include_last_offset: bool = False, padding_idx: int | None = None):
    """float64 embedding_bag: (output [bags, dim] in float64, for max the row each output element
    came from [bags, dim] (-1 in empty bags), else None). Written from segment sums, not from
    torch's embedding_bag, so that tests compare two implementations."""
    import torch

    w = weight.double().cpu()
    idx, offs, bag_of, keep = _entries(indices, offsets, include_last_offset, padding_idx)
    bags = offs.numel() - 1
    rows = w[idx.clamp(0, max(w.shape[0] - 1, 0))] if idx.numel() else w.new_zeros(0, w.shape[1])
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.double().cpu()[:, None]
    out = w.new_zeros(bags, w.shape[1])
    if mode in ("sum", "mean"):
        out.index_add_(0, bag_of[keep], rows[keep])
        if mode == "mean":
            out = out / _counts(bag_of, keep, bags).clamp(min=1)[:, None]
        return out, None
    if mode != "max":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    chosen = torch.full((bags, w.shape[1]), -1, dtype=torch.long)
    for b in range(bags):  # the first maximum of each column wins, as the kernels pick it
        mine = keep & (bag_of == b)
        if mine.any():
            top, at = rows[mine].max(0)
            out[b] = top
            chosen[b] = idx[mine][at]
    return out, chosen


def reference_backward(weight, indices, offsets, mode: str, per_sample_weights, grad_out,
                       include_last_offset: bool = False, padding_idx: int | None = None):
    """float64 gradients of embedding_bag: (d weight [rows, dim], d per_sample_weights [n] or None),
    torch's dense gradient (sparse=False)."""
    import torch

    w = weight.double().cpu()
    g = grad_out.double().cpu()
    idx, offs, bag_of, keep = _entries(indices, offsets, include_last_offset, padding_idx)
    bags = offs.numel() - 1
    grad_w = torch.zeros_like(w)
    if mode == "max":
        _, chosen = reference(weight, indices, offsets, mode, None, include_last_offset, padding_idx)
        col = torch.arange(w.shape[1]).expand(bags, -1)
        found = chosen >= 0
        grad_w.index_put_((chosen[found], col[found]), g[found], accumulate=True)
        return grad_w, None
    scale = torch.ones(idx.numel(), dtype=torch.float64)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.double().cpu()
    if mode == "mean":
        scale = scale / _counts(bag_of, keep, bags).clamp(min=1)[bag_of]
    grad_w.index_add_(0, idx[keep], g[bag_of[keep]] * scale[keep][:, None])
    grad_psw = None
    if per_sample_weights is not None:
        rows = w[idx.clamp(0, max(w.shape[0] - 1, 0))]
        grad_psw = torch.where(keep, (rows * g[bag_of]).sum(1), 0.0) if idx.numel() else scale.new_zeros(0)
    return grad_w, grad_psw


def _counts(bag_of, keep, bags: int):
    import torch

    return torch.zeros(bags, dtype=torch.float64).index_add_(0, bag_of[keep], torch.ones(int(keep.sum()),
                                                                                          dtype=torch.float64))


def _entries(indices, offsets, include_last_offset: bool, padding_idx: int | None):
    """(indices 1-D, offsets with the end, bag of each entry, entries that count)."""
    import torch

    idx, offs = _flat(indices, offsets, include_last_offset)
    n = idx.numel()
    bag_of = torch.repeat_interleave(torch.arange(offs.numel() - 1), (offs[1:] - offs[:-1]).clamp(min=0))[:n]
    keep = torch.ones(n, dtype=torch.bool) if padding_idx is None else idx != padding_idx
    return idx, offs, bag_of, keep


def _flat(indices, offsets, include_last_offset: bool):
    """(1-D indices, offsets with the end appended): torch's two input forms as one."""
    import torch

    if indices.dim() == 2:
        bags, n = indices.shape
        return indices.reshape(-1).long().cpu(), torch.arange(0, bags * n + 1, max(n, 1))[: bags + 1]
    idx = indices.long().cpu()
    offs = offsets.long().cpu()
    if not include_last_offset:
        offs = torch.cat([offs, torch.tensor([idx.numel()])])
    return idx, offs
