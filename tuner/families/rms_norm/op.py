"""RMSNorm's op, declared: `torch.ops.tuner.rms_norm(x, weight=None, eps=1e-6)`; the core renders
its C++ and C ABI from OP_DECLARATION (tuner/build/declared.py) and its CPU and fake kernels from
the float64 reference (tuner/opspec.py). `rms_norm()` is F.rms_norm's signature on it, and
`served` the calls of it the op takes."""

from __future__ import annotations

import math

from ... import declare, opspec, runtime
from .spec import DEFAULT_EPS, DTYPES, reference

FLOAT32_EPS = 2.0 ** -23  # torch's default eps: float32's (what it computes in), for every x dtype

OP_DECLARATION = declare.Op(
    "rms_norm",
    inputs=(declare.Tensor("x", dtypes=DTYPES),
            declare.Tensor("weight", dtypes=DTYPES, shape=("width",), optional=True),
            declare.Scalar("eps", default=DEFAULT_EPS)),
    outputs=(declare.Tensor("y", like="x"),),
    sizes={"rows": "leading(x)", "width": "x.size(-1)"},
    checks=(("x.dim() >= 1", "x must have at least one dimension"),),
    saves=(declare.Tensor("rstd", dtypes=("float32",), shape=("rows",)),),  # 1/rms of each row
    table=("int saves_rstd", "long long (*scratch_floats)(long long rows, long long width)"),
    scratch="vt->scratch_floats(sizes[0], sizes[1])",
    baseline="cast_to(at::rms_norm(x, {x.size(-1)}, weight, eps), x.scalar_type())",  # F.rms_norm, in x's dtype
    # rms_norm() below, its test in C++
    functional=declare.Functional(
        "rms_norm(Tensor input, IntArrayRef normalized_shape, Tensor? weight=None, double? eps=None)",
        serves="input.is_cuda() && input.dim() >= 1 && normalized_shape && normalized_shape->size() == 1 && "
               "(*normalized_shape)[0] == input.size(-1) && (!weight.has_value() || "
               "(weight->dim() == 1 && weight->size(0) == input.size(-1)))",
        call=("input", "weight", f"eps.value_or({FLOAT32_EPS!r})")),
)


def torch_rms_norm(x, weight=None, eps: float = DEFAULT_EPS):
    """The baseline in Python: what the op replaces."""
    import torch

    return torch.rms_norm(x, [x.shape[-1]], weight, eps).to(x.dtype)


def served(input, normalized_shape, weight=None, eps: float | None = None) -> tuple | None:
    """The op's arguments for an F.rms_norm call over one normalized dimension, the last (what
    nn.RMSNorm calls), wherever its tensors are, else None (tuner.capture records those calls by
    it; the declaration's problem then leaves out the dtypes and weights the op does not take)."""
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if len(shape) != 1 or input.dim() < 1 or shape[0] != input.shape[-1]:
        return None
    return input, weight, FLOAT32_EPS if eps is None else eps


@runtime.functional("rms_norm")
def rms_norm(input, normalized_shape, weight=None, eps: float | None = None):
    """`torch.nn.functional.rms_norm`'s signature on the tuned op (load an export first): a call
    over the last dimension of a CUDA tensor goes to `torch.ops.tuner.rms_norm` (a variant, or
    torch's op where the export says so), every other call to F.rms_norm itself. The op's own checks
    follow in C++: only what decides between the two is asked here, in as few steps as Python
    allows; once an export is bound, the binding's C++ form of this function decides first
    (OP_DECLARATION's `functional`), at torch's own call cost."""
    if getattr(input, "is_cuda", False) and input.dtype in runtime.dtypes(DTYPES) and input.dim():  # else F.rms_norm's
        try:
            (width,) = normalized_shape  # one normalized dimension, the last
        except (TypeError, ValueError):
            width = None
        if width == input.size(-1) and (weight is None or (getattr(weight, "shape", None) == (width,)
                                                           and weight.device == input.device)):
            return runtime.entry("rms_norm")(input, weight, FLOAT32_EPS if eps is None else eps)
    import torch.nn.functional as F

    return F.rms_norm(input, normalized_shape, weight, eps)


FUNCTIONS = {"rms_norm": rms_norm}
# A tuned problem serves calls within 4x of its rows x width (log distance ln 4); torch's F.rms_norm
# the rest, untuned dtype pairs, and the problems where no variant beat it. But torch has no fused
# kernel for a weight of another dtype than x (mixed precision's float32 weight over 16-bit x: its
# unfused path is ~10x slower than a variant): variants serve those pairs at every shape, tuned or not.
OP = opspec.spec(OP_DECLARATION, "rms_norm", reference=reference, torch_op=torch_rms_norm, reach=math.log(4),
                 unfused=lambda problem: problem["x"] != problem["weight"])
