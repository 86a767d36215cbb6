"""The EmbeddingBag family's op, `torch.ops.tuner.embedding_bag`, as the runtime binds it (torch alone).

    tuner::embedding_bag(weight, indices, offsets=None, mode="mean", per_sample_weights=None,
                         include_last_offset=False, padding_idx=None) -> Tensor

`torch.nn.functional.embedding_bag`'s meaning for those arguments, with weight first (as
torch.embedding_bag's own op takes it); `embedding_bag()` below takes F.embedding_bag's order
and arguments, and hands the ones this op does not have (max_norm, scale_grad_by_freq,
sparse=True, other dtypes and devices) to F.embedding_bag. The op lives in C++ (templates/embedding_bag/embedding_bag_op.cpp):
schema, CUDA and Autograd kernels and input checks, so that an eager call is one dispatcher
hop; its forward and backward are `tuner::embedding_bag_forward` / `embedding_bag_backward`.
Each winner is staged with its dim, mean bag size and mode (a call runs the nearest). What
stays in Python is off the CUDA path: the CPU implementation (the float64 reference) and the
fake implementation for torch.compile. This module and spec.py import nothing from tuner but
the runtime (relatively), so an exported wheel carries them as they are.
"""

from __future__ import annotations

import math

from ... import runtime
from .spec import INDEX_DTYPES, MODES, WEIGHT_DTYPES, _counts, _entries, reference, reference_backward

NAMESPACE = "tuner_embedding_bag"  # the binding's own ops: stage, publish, set_check, ...
MODE_CODES = {m: i for i, m in enumerate(MODES)}


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type: float = 2.0,
                  scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights=None, include_last_offset: bool = False, padding_idx=None):
    """`torch.nn.functional.embedding_bag`'s signature on the tuned op (load an export first): a
    CUDA call in the op's dtypes goes to `torch.ops.tuner.embedding_bag` (a variant, or torch's op
    where the export says so); a call with max_norm (which renormalizes the table in place),
    scale_grad_by_freq or sparse=True, on another device or in other dtypes, to F.embedding_bag
    itself, so that every call torch accepts works and the results are torch's."""
    import torch
    import torch.nn.functional as F

    weights, indices = runtime.dtypes(WEIGHT_DTYPES), runtime.dtypes(INDEX_DTYPES)
    if (max_norm is not None or scale_grad_by_freq or sparse or not weight.is_cuda or input.is_nested
            or input.device != weight.device or weight.dtype not in weights or input.dtype not in indices
            or (offsets is not None and (offsets.dtype not in indices or offsets.device != weight.device))
            or (per_sample_weights is not None and (per_sample_weights.dtype != weight.dtype or mode != "sum"
                                                    or per_sample_weights.device != weight.device))):
        return F.embedding_bag(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                               per_sample_weights, include_last_offset, padding_idx)
    return torch.ops.tuner.embedding_bag(weight, input, offsets, mode, per_sample_weights, include_last_offset,
                                         padding_idx)


FUNCTIONS = {"embedding_bag": embedding_bag}


# ----------------------------------------------- CPU and fake

def normalize(weight, indices, offsets, mode: str, psw, include_last_offset: bool, padding_idx):
    """The C++ normalize(): checks with its messages, then (1-D indices, offsets with the end of the
    same dtype, padding_idx >= 0 or -1)."""
    import torch

    if mode not in MODES:
        raise ValueError(f"embedding_bag: mode must be one of {MODES}, got {mode!r}")
    if weight.dim() != 2:
        raise ValueError(f"embedding_bag: weight must be 2-D [num_embeddings, dim], got {list(weight.shape)}")
    if weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"embedding_bag: weight must be float32, float16 or bfloat16, got {weight.dtype}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"embedding_bag: indices must be int32 or int64, got {indices.dtype}")
    if indices.device != weight.device:
        raise ValueError(f"embedding_bag: indices are on {indices.device} but weight is on {weight.device}")
    rows = weight.shape[0]
    pad = -1
    if padding_idx is not None:
        if not -rows <= padding_idx < rows:
            raise ValueError(f"embedding_bag: padding_idx must be within [-num_embeddings, num_embeddings) = "
                             f"[{-rows}, {rows}), got {padding_idx}")
        pad = padding_idx + rows if padding_idx < 0 else padding_idx
    if psw is not None:
        if mode != "sum":
            raise ValueError("embedding_bag: per_sample_weights are only supported for mode='sum'")
        if psw.shape != indices.shape:
            raise ValueError(f"embedding_bag: per_sample_weights {list(psw.shape)} must have the shape of indices "
                             f"{list(indices.shape)}")
        if psw.dtype != weight.dtype:
            raise TypeError(f"embedding_bag: per_sample_weights must have weight's dtype {weight.dtype}, got {psw.dtype}")
    if indices.dim() == 2:
        if offsets is not None:
            raise ValueError("embedding_bag: offsets must be None when indices are 2-D")
        bags, per = indices.shape
        return indices.reshape(-1), torch.arange(bags + 1, dtype=indices.dtype, device=indices.device) * per, pad
    if indices.dim() != 1:
        raise ValueError(f"embedding_bag: indices must be 1-D (with offsets) or 2-D, got {list(indices.shape)}")
    if offsets is None:
        raise ValueError("embedding_bag: offsets are required when indices are 1-D")
    if offsets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"embedding_bag: offsets must be int32 or int64, got {offsets.dtype}")
    if offsets.dim() != 1:
        raise ValueError(f"embedding_bag: offsets must be 1-D, got {list(offsets.shape)}")
    if include_last_offset and offsets.numel() < 1:
        raise ValueError("embedding_bag: include_last_offset needs at least one offset")
    dtype = offsets.dtype if indices.dtype == offsets.dtype else torch.int64
    if not include_last_offset:
        offsets = torch.cat([offsets, offsets.new_tensor([indices.numel()])])
    return indices.to(dtype), offsets.to(dtype), pad


def _check_values(weight, indices, offsets) -> None:
    """What a validating kernel reports, checked at once on CPU (where it costs no sync)."""
    n = indices.numel()
    if n and bool(((indices < 0) | (indices >= weight.shape[0])).any()):
        raise runtime.KernelInputError("embedding_bag: invalid input: an index is outside [0, num_embeddings)")
    if offsets.numel() and bool((offsets[1:] < offsets[:-1]).any() | (offsets < 0).any() | (offsets > n).any()):
        raise runtime.KernelInputError("embedding_bag: invalid input: offsets decrease or fall outside [0, len(indices)]")


def _forward_cpu(weight, indices, offsets, mode: int, psw, include_last_offset: bool, padding_idx):
    import torch

    name = MODES[mode]
    idx, offs, pad = normalize(weight, indices, offsets, name, psw, include_last_offset, padding_idx)
    _check_values(weight, idx, offs)
    psw = psw.reshape(-1) if psw is not None else None
    pad = None if pad < 0 else pad
    out, chosen = reference(weight, idx, offs, name, psw, include_last_offset=True, padding_idx=pad)
    maxi = chosen if chosen is not None else torch.empty(0, weight.shape[1], dtype=torch.int64)
    _, _, bag_of, keep = _entries(idx, offs, True, pad)
    count = _counts(bag_of, keep, offs.numel() - 1).float() if name == "mean" else torch.empty(0)
    return out.to(weight.dtype), maxi, count


def _backward_cpu(grad, weight, indices, offsets, mode: int, psw, include_last_offset: bool, padding_idx,
                  max_indices, bag_count, weight_grad: bool, psw_grad: bool):
    name = MODES[mode]
    idx, offs, pad = normalize(weight, indices, offsets, name, psw, include_last_offset, padding_idx)
    flat_psw = psw.reshape(-1) if psw is not None else None
    gw, gp = reference_backward(weight, idx, offs, name, flat_psw, grad, include_last_offset=True,
                                   padding_idx=None if pad < 0 else pad)
    gw = gw.to(weight.dtype) if weight_grad else weight.new_empty(0)
    gp = gp.to(weight.dtype).reshape(psw.shape) if psw_grad and gp is not None else weight.new_empty(0)
    return gw, gp


def _op_cpu(weight, indices, offsets=None, mode="mean", per_sample_weights=None, include_last_offset=False,
            padding_idx=None):
    if mode not in MODE_CODES:
        raise ValueError(f"embedding_bag: mode must be one of {MODES}, got {mode!r}")
    return _forward_cpu(weight, indices, offsets, MODE_CODES[mode], per_sample_weights, include_last_offset,
                        padding_idx)[0]


def _bags(indices, offsets, include_last_offset: bool):
    if indices.dim() == 2:
        return indices.shape[0]
    if offsets is None:
        raise ValueError("embedding_bag: offsets are required when indices are 1-D")
    return offsets.shape[0] - (1 if include_last_offset else 0)


def _op_fake(weight, indices, offsets=None, mode="mean", per_sample_weights=None, include_last_offset=False,
             padding_idx=None):
    return weight.new_empty((_bags(indices, offsets, include_last_offset), weight.shape[1]))


def _forward_fake(weight, indices, offsets, mode: int, psw, include_last_offset: bool, padding_idx):
    import torch

    bags, dim = _bags(indices, offsets, include_last_offset), weight.shape[1]
    return (weight.new_empty((bags, dim)), weight.new_empty((bags if mode == 2 else 0, dim), dtype=torch.int64),
            weight.new_empty((bags if mode == 1 else 0,), dtype=torch.float32))


def _backward_fake(grad, weight, indices, offsets, mode, psw, include_last_offset, padding_idx, max_indices,
                   bag_count, weight_grad, psw_grad):
    return (weight.new_empty(weight.shape if weight_grad else (0,)),
            psw.new_empty(psw.shape) if psw_grad and psw is not None else weight.new_empty((0,)))


def _pair(problem: dict) -> int:
    """A dtype pair's index, as embedding_bag_op.cpp's pair_of numbers it."""
    return WEIGHT_DTYPES.index(problem["weight"]) * 2 + INDEX_DTYPES.index(problem["index"])


# A tuned problem serves calls of its mode within 4x of its dim x mean bag size (log distance ln 4);
# torch's embedding_bag serves the rest, untuned dtype pairs and modes, and the problems where no
# variant beat it (but a bfloat16 max backward, which torch does not have).
OP = runtime.OpSpec(
    family="embedding_bag", op="embedding_bag", namespace=NAMESPACE, abi=4,
    shape=lambda problem: ([problem["dim"], problem["bag_size"]], MODE_CODES[problem["mode"]]),
    baseline=True, reach=math.log(4), pair=_pair,
    impls={"embedding_bag": (_op_cpu, _op_fake),
           "embedding_bag_forward": (_forward_cpu, _forward_fake),
           "embedding_bag_backward": (_backward_cpu, _backward_fake)},
    extras={"F_embedding_bag": embedding_bag})
