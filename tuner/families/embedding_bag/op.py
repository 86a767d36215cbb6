"""EmbeddingBag's op, declared: `torch.ops.tuner.embedding_bag(weight, indices, offsets=None, mode="mean",
per_sample_weights=None, include_last_offset=False, padding_idx=None)`, F.embedding_bag's meaning
with weight first (as torch.embedding_bag takes it). The core renders its C++ and C ABI from
OP_DECLARATION (tuner/build/declared.py), its CPU and fake kernels from the float64 reference;
`embedding_bag()` is F.embedding_bag's signature on it, and `served` the calls of it the op takes
(tuner.capture records them by it). This module and spec.py import nothing of
tuner but the core's declaration modules, so that an exported wheel carries them as they are."""

from __future__ import annotations

import math

from ... import declare, opspec, runtime
from .spec import INDEX_DTYPES, MODES, WEIGHT_DTYPES, reference as _reference

_BAGS = "indices.size(0) if indices.dim() == 2 else offsets.numel() - (1 if include_last_offset else 0)"
OP_DECLARATION = declare.Op(
    "embedding_bag", abi=5,
    inputs=(declare.Tensor("weight", dtypes=WEIGHT_DTYPES),
            declare.Tensor("indices", dtypes=INDEX_DTYPES, grad=False),
            declare.Tensor("offsets", like="indices", shape=..., grad=False, optional="null"),  # None with 2-D indices
            declare.Scalar("mode", "str", default="mean", choices=MODES),
            declare.Tensor("per_sample_weights", like="weight", shape="indices", optional="null"),
            declare.Scalar("include_last_offset", "bool", default=False),
            declare.Scalar("padding_idx", "int", optional=True)),
    outputs=(declare.Tensor("out", like="weight", shape=("bags", "dim")),),
    # the key is (dim, mean bag, bags), the count of bags loose (within reach at any count, measured at
    # more by the export); n and bag_length (2-D indices: their rows' length, else -1) tell the variants
    # how bags split the entries
    sizes={"rows": "weight.size(0)", "dim": "weight.size(1)", "bags": _BAGS,
           "bag_size": f"ratio(indices.numel(), {_BAGS})", "n": "indices.numel()",
           "bag_length": "indices.size(1) if indices.dim() == 2 else 0 - 1"},
    key=("dim", "bag_size", "bags"), loose=1, kind="mode",
    checks=(("weight.dim() == 2", "weight must be 2-D [num_embeddings, dim]"),
            # the kernels clamp an index into the table: an empty one has no row to clamp to
            ("weight.size(0) >= 1 or indices.numel() == 0", "weight has no rows for the indices to name"),
            ("indices.dim() == 1 or indices.dim() == 2", "indices must be 1-D (with offsets) or 2-D"),
            ("indices.dim() == 1 or offsets is None", "offsets must be None when indices are 2-D"),
            ("indices.dim() == 2 or not (offsets is None)", "offsets are required when indices are 1-D"),
            ("offsets is None or offsets.dim() == 1", "offsets must be 1-D"),
            ("offsets is None or not include_last_offset or offsets.numel() >= 1",
             "include_last_offset needs at least one offset"),
            ("per_sample_weights is None or mode == 'sum'", "per_sample_weights are only supported for mode='sum'"),
            ("padding_idx is None or (padding_idx >= 0 - weight.size(0) and padding_idx < weight.size(0))",
             "padding_idx must be within [-num_embeddings, num_embeddings)")),
    saves=(declare.Tensor("max_indices", dtypes=("int64",), shape=("bags", "dim"), when=("mode", ("max",))),
           declare.Tensor("bag_count", dtypes=("float32",), shape=("bags",), when=("mode", ("mean",)))),
    errors=(("bad_index", "an index is outside [0, num_embeddings)"),
            ("bad_offset", "offsets decrease or fall outside [0, len(indices)]")),
    table=("int split",),  # entries per chunk of a split bag (0: a group per bag)
    workspace="sizes[2] * (vt->split > 0)",  # a split variant's arrivals, one a bag
    work=("forward", "backward"),  # split bags' partials; the sorted backward's bag of each entry and partials
    # where torch's op serves a CUDA call: a bad index would fire its device-side assert
    guards=(("indices", "weight.size(0)", "bad_index"), ("offsets", "indices.numel() + 1", "bad_offset", "ascending")),
    sorted=("indices",),
    zeroed=("weight", "per_sample_weights"),  # rows no entry names, entries in no bag
    # torch's embedding_bag as F.embedding_bag calls it (2-D indices flat, an offset every row; padding
    # from the end where negative). torch has no bfloat16 backward of max or of per_sample_weights:
    # a call that will want one runs in float32.
    baseline="""
      at::Tensor flat = indices, starts = offsets.value_or(at::Tensor());
      std::optional<at::Tensor> scale = per_sample_weights;
      if (indices.dim() == 2) {
        starts = at::arange(indices.size(0), indices.options()) * indices.size(1);
        flat = indices.reshape(-1);
        if (scale.has_value()) scale = scale->reshape(-1);
      }
      const std::optional<int64_t> pad = padding_idx.has_value() && *padding_idx < 0
          ? std::optional<int64_t>(*padding_idx + weight.size(0)) : padding_idx;
      const int64_t code = mode_index(mode);
      const bool wide = weight.scalar_type() == at::kBFloat16 && at::GradMode::is_enabled() &&
          (weight.requires_grad() || (scale.has_value() && scale->requires_grad())) && (code == 2 || scale.has_value());
      if (wide) {
        const std::optional<at::Tensor> wide_scale = scale.has_value() ? std::optional<at::Tensor>(scale->to(at::kFloat))
                                                                        : std::nullopt;
        return std::get<0>(at::embedding_bag(weight.to(at::kFloat), flat, starts, false, code, false, wide_scale,
                                             include_last_offset && indices.dim() == 1, pad)).to(at::kBFloat16);
      }
      return std::get<0>(at::embedding_bag(weight, flat, starts, false, code, false, scale,
                                           include_last_offset && indices.dim() == 1, pad));""",
    functional=declare.Functional(  # embedding_bag() below, its test in C++
        "embedding_bag(Tensor input, Tensor weight, Tensor? offsets=None, double? max_norm=None, double norm_type=2, "
        "bool scale_grad_by_freq=False, c10::string_view mode=\"mean\", bool sparse=False, "
        "Tensor? per_sample_weights=None, bool include_last_offset=False, int64_t? padding_idx=None)",
        serves="!max_norm.has_value() && !scale_grad_by_freq && !sparse && weight.is_cuda() && !input.is_nested() && "
               "(!per_sample_weights.has_value() || mode == \"sum\") && (!padding_idx.has_value() || "
               "(*padding_idx >= -weight.size(0) && *padding_idx < weight.size(0)))",
        call=("weight", "input", "offsets", "mode", "per_sample_weights", "include_last_offset", "padding_idx")),
)


def reference(weight, indices, offsets=None, mode: str = "mean", per_sample_weights=None,
              include_last_offset: bool = False, padding_idx: int | None = None):
    """The float64 output (spec.reference's: padding_idx from the end where negative, per-sample
    weights one an entry, in the indices' order). Bad indices and offsets are the op's errors (its
    guards: the CPU op refuses them), not the reference's."""
    pad = None if padding_idx is None else padding_idx % weight.shape[0]
    psw = None if per_sample_weights is None else per_sample_weights.reshape(-1)
    out, chosen = _reference(weight, indices, offsets, mode, psw, include_last_offset, pad)
    if chosen is None:
        return out
    # max: each element the chosen row's (the first maximum in entry order, as the kernels pick it),
    # so that autograd gives it the whole gradient where rows tie (16-bit tables tie often)
    import torch

    column = torch.arange(weight.shape[1], device=chosen.device).expand_as(chosen)
    return torch.where(chosen >= 0, weight.double()[chosen.clamp(min=0), column], 0.0)


def torch_embedding_bag(weight, indices, offsets=None, mode: str = "mean", per_sample_weights=None,
                        include_last_offset: bool = False, padding_idx: int | None = None):
    """The baseline in Python: what the op replaces."""
    import torch.nn.functional as F

    return F.embedding_bag(indices, weight, offsets, mode=mode, per_sample_weights=per_sample_weights,
                           include_last_offset=include_last_offset, padding_idx=padding_idx)


def served(input, weight, offsets=None, max_norm=None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
           mode: str = "mean", sparse: bool = False, per_sample_weights=None, include_last_offset: bool = False,
           padding_idx=None) -> tuple | None:
    """The op's arguments for an F.embedding_bag call it takes, wherever its tensors are (the op's
    dtypes), else None: max_norm (which renormalizes the table in place), scale_grad_by_freq and
    sparse=True are torch's alone, as are per-sample weights of another dtype or mode; a mode or a
    padding_idx torch refuses is left to torch's words (a RuntimeError for a padding_idx outside the
    table, as code catching torch's expects)."""
    indices = runtime.dtypes(INDEX_DTYPES)
    if (max_norm is not None or scale_grad_by_freq or sparse or input.is_nested
            or weight.dtype not in runtime.dtypes(WEIGHT_DTYPES) or input.dtype not in indices
            or (offsets is not None and offsets.dtype not in indices)
            or (per_sample_weights is not None and (per_sample_weights.dtype != weight.dtype or mode != "sum"))
            or mode not in MODES or (padding_idx is not None and not -weight.shape[0] <= padding_idx < weight.shape[0])):
        return None
    return weight, input, offsets, mode, per_sample_weights, include_last_offset, padding_idx


@runtime.functional("embedding_bag")
def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type: float = 2.0,
                  scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights=None, include_last_offset: bool = False, padding_idx=None):
    """`torch.nn.functional.embedding_bag`'s signature on the tuned op (load an export first): a
    CUDA call it takes (`served`, every tensor on the weight's device) goes to
    `torch.ops.tuner.embedding_bag` (a variant, or torch's op where the export says so), any other
    to F.embedding_bag itself, so that every call torch accepts works and the results are torch's."""
    call = served(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse, per_sample_weights,
                  include_last_offset, padding_idx) if weight.is_cuda else None
    if call is not None and all(t is None or t.device == weight.device for t in (input, offsets, per_sample_weights)):
        return runtime.entry("embedding_bag")(*call)
    import torch.nn.functional as F

    return F.embedding_bag(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                           per_sample_weights, include_last_offset, padding_idx)


FUNCTIONS = {"embedding_bag": embedding_bag}
# A tuned problem serves calls within 4x of its dim x mean bag size (log distance ln 4; any count of bags), as do the
# shapes the export measured around it where a variant won (tuner.deploy.regions); untuned modes and
# dtype pairs (tuned parameters rendered for them) likewise: torch's op behind its guard (a launch
# more, which decides a small call) serves where it won, and farther.
OP = opspec.spec(OP_DECLARATION, "embedding_bag", reference=reference, torch_op=torch_embedding_bag,
                 reach=math.log(4), extras={"F_embedding_bag": embedding_bag}, dtype_fields={"indices": "index"},
                 untuned_by_baseline=False)
