"""Which calls of a training run EmbeddingBag tunes, as its Problem (tuner.capture):
F.embedding_bag (what nn.EmbeddingBag calls) and the tuned op `tuner::embedding_bag` (weight
first). The bag size is the mean entries per bag, from the sizes alone (reading offsets would
wait for the GPU); ids are taken as random. Calls with max_norm, scale_grad_by_freq or sparse
gradients, other dtypes, or no bags are not this family's: None."""

from __future__ import annotations

from tuner.deploy.capturing import dtype_of
from tuner.families.embedding_bag.spec import INDEX_DTYPES, MODES, WEIGHT_DTYPES


def _problem(weight, indices, offsets, mode: str, include_last_offset: bool) -> dict | None:
    if weight.dim() != 2 or dtype_of(weight) not in WEIGHT_DTYPES or dtype_of(indices) not in INDEX_DTYPES:
        return None
    if mode not in MODES:
        return None
    if indices.dim() == 2 and offsets is None:
        bags = indices.shape[0]
    elif indices.dim() == 1 and offsets is not None and offsets.dim() == 1:
        bags = offsets.shape[0] - (1 if include_last_offset else 0)
    else:
        return None
    if bags < 1 or weight.shape[0] == 0:
        return None
    return {"rows": weight.shape[0], "dim": weight.shape[1], "bags": bags,
            "bag_size": max(1, round(indices.numel() / bags)), "mode": mode, "weight": dtype_of(weight),
            "index": dtype_of(indices), "distribution": "random"}


def _functional(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None) -> dict | None:
    if max_norm is not None or scale_grad_by_freq or sparse:
        return None
    return _problem(weight, input, offsets, mode, include_last_offset)


def _op(weight, indices, offsets=None, mode="mean", per_sample_weights=None, include_last_offset=False,
        padding_idx=None) -> dict | None:
    return _problem(weight, indices, offsets, mode, include_last_offset)


CALLS = {
    "torch.nn.functional.embedding_bag": lambda args, kwargs: _functional(*args, **kwargs),
    "tuner::embedding_bag": lambda args, kwargs: _op(*args, **kwargs),
}
