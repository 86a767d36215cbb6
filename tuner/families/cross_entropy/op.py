"""Cross-entropy's op, declared: `torch.ops.tuner.cross_entropy(logits, target, ignore_index=-100,
label_smoothing=0.0, reduction="mean", in_place=False)`, F.cross_entropy over logits [rows, vocab]
with a float32 loss. `in_place=True` lets the op write the logits' gradient over the logits (as
Liger's does): no memory for the gradient, and the logits are gone after the forward, so only for
logits nothing else reads (an LM head's, in eager mode; torch.compile is not told of the write).
The core renders its C++, C ABI, CPU and fake kernels from OP_DECLARATION and the reference."""

from __future__ import annotations

import math

from ... import declare, opspec, runtime
from .spec import BAD_TARGET, DTYPES, REDUCTIONS, reference

OP_DECLARATION = declare.Op(
    "cross_entropy",
    inputs=(declare.Tensor("logits", dtypes=DTYPES),
            declare.Tensor("target", dtypes=("int64",), grad=False, shape=("rows",)),
            declare.Scalar("ignore_index", "int", -100), declare.Scalar("label_smoothing", "float", 0.0),
            declare.Scalar("reduction", "str", "mean", choices=REDUCTIONS),
            declare.Scalar("in_place", "bool", False)),  # opt-in: the logits' storage takes their gradient
    outputs=(declare.Tensor("loss", dtypes=("float32",), shape=("rows",), reduced_by="reduction"),),
    sizes={"rows": "leading(logits)", "vocab": "logits.size(-1)"},
    checks=(("logits.dim() == 2", "logits must be [rows, vocab]"),
            # no class for a target to name: the kernels would write no loss at all
            ("logits.size(1) >= 1 or logits.size(0) == 0", "logits must have at least one class")),
    errors=(("bad_target", BAD_TARGET),),  # found by the forward's kernel
    # where torch's op serves (a problem where it was faster): a bad target would fire its device-side assert
    guards=(("target", "logits.size(-1)", "bad_target", "ignore_index"),),
    abi=2,
    saves=(declare.Tensor("lse", dtypes=("float32",), shape=("rows",)),  # each row's log-sum-exp
           declare.Tensor("count", dtypes=("float32",), shape=()),  # rows whose target is not ignored
           # written in the forward, or the backward; in the logits' storage where in_place is set
           declare.Tensor("gradient", like="logits", gradient_of="logits", in_place="in_place")),
    baseline="cast_to(at::cross_entropy_loss(logits, target, std::nullopt, reduction == \"none\" ? 0 : "
             "reduction == \"mean\" ? 1 : 2, ignore_index, label_smoothing), at::kFloat)",
    functional=declare.Functional(  # cross_entropy() below, its test in C++
        "cross_entropy(Tensor input, Tensor target, Tensor? weight=None, bool? size_average=None, "
        "int64_t ignore_index=-100, bool? reduce=None, c10::string_view reduction=\"mean\", "
        "double label_smoothing=0.0, *, bool in_place=False)",
        serves="input.is_cuda() && !weight.has_value() && !size_average.has_value() && !reduce.has_value() && "
               "input.dim() == 2 && target.dim() == 1 && "
               "label_smoothing >= 0.0 && label_smoothing <= 1.0",
        call=("input", "target", "ignore_index", "label_smoothing", "reduction", "in_place")),
)


def torch_cross_entropy(logits, target, ignore_index: int = -100, label_smoothing: float = 0.0,
                        reduction: str = "mean", in_place: bool = False):
    """The baseline in Python: F.cross_entropy, its loss in float32."""
    import torch.nn.functional as F

    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing).float()


def served(input, target, weight=None, size_average=None, ignore_index: int = -100, reduce=None,
           reduction: str = "mean", label_smoothing: float = 0.0) -> tuple | None:
    """The op's arguments for an F.cross_entropy call it takes (int64 class indices over the last
    dimension of 2-D logits in the op's dtypes, no class weights, arguments torch accepts), else
    None: torch's function answers the rest, its errors and warnings included (a label smoothing
    outside [0, 1], "elementwise_mean", a uint8 target, float64 logits)."""
    import torch

    if (weight is not None or size_average is not None or reduce is not None or input.dim() != 2
            or not isinstance(target, torch.Tensor) or target.dim() != 1 or target.device != input.device
            or input.dtype not in runtime.dtypes(DTYPES) or target.dtype != torch.int64
            or reduction not in REDUCTIONS or not 0.0 <= label_smoothing <= 1.0):
        return None
    return input, target, ignore_index, float(label_smoothing), reduction


@runtime.functional("cross_entropy")
def cross_entropy(input, target, *args, in_place: bool = False, **kwargs):
    """`torch.nn.functional.cross_entropy`'s signature on the tuned op (load an export first): the
    calls it takes go to `torch.ops.tuner.cross_entropy` (a variant, or torch's op where the export
    says so; its loss in float32), every other call to F.cross_entropy itself. `in_place=True`: the
    logits' gradient may be written over the logits (see the op)."""
    # (not a tensor: F.cross_entropy's own TypeError)
    args_ = served(input, target, *args, **kwargs) if getattr(input, "is_cuda", False) else None
    if args_ is not None:
        return runtime.entry("cross_entropy")(*args_, in_place)
    import torch.nn.functional as F

    return F.cross_entropy(input, target, *args, **kwargs)


FUNCTIONS = {"cross_entropy": cross_entropy}
# torch's cross-entropy is never one kernel (log-softmax, then the loss; the same again backward,
# and the cast to the op's float32 loss): a variant serves every shape of every dtype, the nearest
# tuned problem's parameters where none was tuned near (faster at every shape measured, searched or
# not: 3.9x torch's forward at 2048 x 151936, 3.5x at 4096 x 50257 float32 logits, torch's cost at
# 1 x 32000; docs/benchmarks.md), torch's op only where the export's check found it faster at a
# tuned problem.
OP = opspec.spec(OP_DECLARATION, "cross_entropy", reference=reference, torch_op=torch_cross_entropy,
                 reach=math.log(4), unfused=lambda problem: True)
