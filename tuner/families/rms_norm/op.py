"""RMSNorm's op, `torch.ops.tuner.rms_norm(x, weight=None, eps=1e-6)`, as the runtime binds it
(torch alone), and `rms_norm()`, F.rms_norm's signature on it. Schema, CUDA and Autograd kernels
live in C++ (templates/rms_norm/rms_norm_op.cpp); its forward and backward ops are `tuner::rms_norm_forward(x, weight, eps) -> (y, rstd)` and
`tuner::rms_norm_backward(grad, x, weight, rstd, eps, x_grad, weight_grad) -> (grad_x,
grad_weight)`. Here: the CPU implementation (the float64 reference) and the fake one."""

from __future__ import annotations

import math

from ... import runtime
from .spec import DEFAULT_EPS, DTYPES, reference, reference_backward, rstd

NAMESPACE = "tuner_rms_norm"


def rms_norm(input, normalized_shape, weight=None, eps: float | None = None):
    """`torch.nn.functional.rms_norm`'s signature on the tuned op (load an export first): a call
    over the last dimension of a CUDA tensor goes to `torch.ops.tuner.rms_norm` (a variant, or
    torch's op where the export says so), every other call to F.rms_norm itself, so that every
    call torch accepts works and the results are torch's."""
    import torch
    import torch.nn.functional as F

    shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) else ()
    if (len(shape) != 1 or not input.is_cuda or input.dim() < 1 or shape[0] != input.shape[-1]
            or input.dtype not in runtime.dtypes(DTYPES)
            or (weight is not None and tuple(weight.shape) != shape)):
        return F.rms_norm(input, normalized_shape, weight, eps)
    if eps is None:  # torch's default: the machine epsilon of the dtype it computes in, float32 here
        eps = _FLOAT32_EPS
    return torch.ops.tuner.rms_norm(input, weight, eps)


_FLOAT32_EPS = 2.0 ** -23  # torch.finfo(torch.float32).eps


FUNCTIONS = {"rms_norm": rms_norm}


def _check_shapes(x, weight) -> None:
    """The C++ check_shapes (rms_norm_op.cpp) and its messages, for the CPU and fake paths."""
    if x.dim() < 1:
        raise ValueError("rms_norm: x must have at least one dimension")
    if weight is None:
        return
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"rms_norm: weight must have shape [{x.shape[-1]}] (x's last dimension), "
                         f"got {list(weight.shape)}")
    if weight.device != x.device:
        raise ValueError(f"rms_norm: x is on {x.device} but weight is on {weight.device}")


def _outside_variants(x, weight) -> bool:
    """No weight, or a dtype no variant takes: torch's op serves the call (as in C++)."""
    return weight is None or not {x.dtype, weight.dtype} <= runtime.dtypes(DTYPES)


def _check(x, weight) -> None:
    """The C++ checks and messages (rms_norm_op.cpp), for the CPU and fake paths."""
    _check_shapes(x, weight)
    for name, t in (("x", x), ("weight", weight)):
        if str(t.dtype).removeprefix("torch.") not in DTYPES:
            raise TypeError(f"rms_norm: {name} must be float32, float16 or bfloat16, got {t.dtype}")


def _op_cpu(x, weight=None, eps: float = DEFAULT_EPS):
    import torch

    _check_shapes(x, weight)
    if _outside_variants(x, weight):
        return torch.rms_norm(x, [x.shape[-1]], weight, eps).to(x.dtype)
    return _forward_cpu(x, weight, eps)[0]


def _op_fake(x, weight=None, eps: float = DEFAULT_EPS):
    _check_shapes(x, weight)
    return x.new_empty(x.shape)


def _rows(x):
    return math.prod(x.shape[:-1])


def _forward_cpu(x, weight, eps: float):
    import torch

    _check(x, weight)
    return reference(x, weight, eps).to(x.dtype), rstd(x, eps).reshape(-1).to(torch.float32)


def _backward_cpu(grad, x, weight, saved_rstd, eps: float, x_grad: bool, weight_grad: bool):
    _check(x, weight)
    gx, gw = reference_backward(x, weight, grad, eps)
    return (gx.to(x.dtype) if x_grad else x.new_empty(0)), (gw.to(weight.dtype) if weight_grad else weight.new_empty(0))


def _forward_fake(x, weight, eps: float):
    import torch

    _check(x, weight)
    return x.new_empty(x.shape), x.new_empty((_rows(x),), dtype=torch.float32)


def _backward_fake(grad, x, weight, saved_rstd, eps, x_grad, weight_grad):
    return (x.new_empty(x.shape if x_grad else (0,)), weight.new_empty(weight.shape if weight_grad else (0,)))


def _pair(problem: dict) -> int:
    """A dtype pair's index, as rms_norm_op.cpp's pair_of numbers it."""
    return DTYPES.index(problem["x"]) * 3 + DTYPES.index(problem["weight"])


# A tuned problem serves calls within 4x of its rows x width (log distance ln 4: 2x each way in both,
# or 4x in one); torch's F.rms_norm serves the rest, untuned dtype pairs, and the problems where no
# variant beat it.
OP = runtime.OpSpec(
    family="rms_norm", op="rms_norm", namespace=NAMESPACE, abi=1,
    shape=lambda problem: ([problem["rows"], problem["width"]], 0),
    baseline=True, reach=math.log(4), pair=_pair,
    impls={"rms_norm": (_op_cpu, _op_fake),
           "rms_norm_forward": (_forward_cpu, _forward_fake),
           "rms_norm_backward": (_backward_cpu, _backward_fake)})
