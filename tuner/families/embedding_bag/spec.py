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
    torch's embedding_bag, so that tests compare two implementations. Computed on weight's device
    (a search checks on the GPU; the op's CPU implementation stays on the CPU)."""
    w = weight.double()
    idx, offs, bag_of, keep = _entries(indices, offsets, include_last_offset, padding_idx, w.device)
    bags = offs.numel() - 1
    rows = _rows(w, idx)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.to(w.device, w.dtype)[:, None]
    if mode in ("sum", "mean"):
        out = w.new_zeros(bags, w.shape[1]).index_add_(0, bag_of[keep], rows[keep])
        if mode == "mean":
            out = out / _counts(bag_of, keep, bags).clamp(min=1)[:, None]
        return out, None
    if mode != "max":
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return _max(rows[keep], bag_of[keep], idx[keep], bags)


def _max(rows, bag_of, idx, bags: int):
    """max over each bag's rows (the entries that count, in entry order): (output, chosen row).
    The first maximum of each column wins, as the kernels pick it: the bag's max per column by a
    scatter amax, then the first entry reaching it by a scatter amin over entry positions."""
    import torch

    n, dim = rows.shape
    to_bag = bag_of[:, None].expand(n, dim)
    top = rows.new_full((bags, dim), float("-inf")).scatter_reduce(0, to_bag, rows, "amax")
    pos = torch.arange(n, device=rows.device)[:, None].expand(n, dim)
    best = top[bag_of]
    # torch.max's NaN rule, as this reference had it: a NaN is the maximum, and the first one wins
    hit = (rows == best) | (rows.isnan() & best.isnan())
    reached = torch.where(hit, pos, n)  # n: not a maximum (nor any entry)
    first = torch.full((bags, dim), n, device=rows.device).scatter_reduce(0, to_bag, reached, "amin")
    chosen = torch.cat([idx, idx.new_full((1,), -1)])[first]  # position n: the bag is empty
    return torch.where(first < n, top, 0.0), chosen


def _rows(w, idx):
    """The rows the entries name (clamped: an out-of-range id is the op's error, not the reference's)."""
    return w[idx.clamp(0, max(w.shape[0] - 1, 0))] if idx.numel() else w.new_zeros(0, w.shape[1])


def _counts(bag_of, keep, bags: int):
    """Entries that count per bag, float64, on bag_of's device."""
    import torch

    counted = bag_of[keep]
    return torch.zeros(bags, dtype=torch.float64, device=bag_of.device).index_add_(
        0, counted, torch.ones(counted.shape, dtype=torch.float64, device=bag_of.device))


def _entries(indices, offsets, include_last_offset: bool, padding_idx: int | None, device=None):
    """(indices 1-D, offsets with the end, bag of each entry (0 where in none), entries that count),
    on `device` (default: the indices')."""
    import torch

    idx, offs = _flat(indices, offsets, include_last_offset, device)
    position = torch.arange(idx.numel(), device=idx.device)
    # the last bag that starts at or before an entry; entries before the first offset or past the end
    # (include_last_offset's last offset) are in no bag
    bag_of = torch.searchsorted(offs[:-1].contiguous(), position, right=True) - 1
    keep = (bag_of >= 0) & (position < offs[-1])
    if padding_idx is not None:
        keep &= idx != padding_idx
    return idx, offs, bag_of.clamp(min=0), keep


def _flat(indices, offsets, include_last_offset: bool, device=None):
    """(1-D indices, offsets with the end appended), int64 on `device` (default: the indices'):
    torch's two input forms as one."""
    import torch

    device = indices.device if device is None else device
    if indices.dim() == 2:
        bags, n = indices.shape
        offs = torch.arange(bags + 1, device=device) * n
        return indices.reshape(-1).to(device, torch.long), offs
    idx = indices.to(device, torch.long)
    offs = offsets.to(device, torch.long)
    if not include_last_offset:
        offs = torch.cat([offs, offs.new_full((1,), idx.numel())])
    return idx, offs
