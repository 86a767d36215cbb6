"""Linear cross-entropy's op, declared: `torch.ops.tuner.linear_cross_entropy(hidden, weight, target,
ignore_index=-100, label_smoothing=0.0, reduction="mean")`, its loss in float32; the core renders its
C++, C ABI, CPU and fake kernels from OP_DECLARATION and the reference."""

from __future__ import annotations

from ... import declare, opspec, runtime
from .spec import BAD_TARGET, DTYPES, REDUCTIONS, reference

OP_DECLARATION = declare.Op(
    "linear_cross_entropy",
    inputs=(declare.Tensor("hidden", dtypes=DTYPES, shape=("tokens", "width")),
            declare.Tensor("weight", like="hidden", shape=("vocab", "width")),
            declare.Tensor("target", dtypes=("int64",), grad=False, shape=("tokens",)),
            declare.Scalar("ignore_index", "int", -100), declare.Scalar("label_smoothing", "float", 0.0),
            declare.Scalar("reduction", "str", "mean", choices=REDUCTIONS)),
    outputs=(declare.Tensor("loss", dtypes=("float32",), shape=("tokens",), reduced_by="reduction"),),
    sizes={"tokens": "hidden.size(0)", "width": "hidden.size(1)", "vocab": "weight.size(0)"},
    checks=(("hidden.dim() == 2", "hidden must be [tokens, H]"), ("weight.dim() == 2", "weight must be [vocab, H]"),
            ("weight.size(1) == hidden.size(1)", "weight must be [vocab, H], H as hidden's"),
            ("weight.size(0) >= 1", "weight must have at least one class")),
    errors=(("bad_target", BAD_TARGET),),  # found by the cross-entropy kernel
    guards=(("target", "weight.size(0)", "bad_target", "ignore_index"),),  # torch's path: its device-side assert
    abi=1,
    saves=(declare.Tensor("lse", dtypes=("float32",), shape=("tokens",)),  # each row's log-sum-exp
           declare.Tensor("count", dtypes=("float32",), shape=()),  # rows whose target is not ignored
           # written by the forward for an output gradient of 1 (a mean's or a sum's), scaled by the
           # backward; reduction none's written by the backward, the logits recomputed
           declare.Tensor("grad_of_hidden", like="hidden", gradient_of="hidden"),
           declare.Tensor("grad_of_weight", like="weight", gradient_of="weight")),
    work=("forward", "backward"),  # a chunk of rows' logits
    libraries=("cublas",),
    baseline="cast_to(at::cross_entropy_loss(at::linear(hidden, weight), target, std::nullopt, reduction == \"none\" ? 0 : "
             "reduction == \"mean\" ? 1 : 2, ignore_index, label_smoothing), at::kFloat)",
)


def torch_linear_cross_entropy(hidden, weight, target, ignore_index: int = -100, label_smoothing: float = 0.0,
                               reduction: str = "mean"):
    """The baseline in Python: F.linear, then F.cross_entropy, its loss in float32."""
    import torch.nn.functional as F

    return F.cross_entropy(F.linear(hidden, weight), target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing).float()


def linear_cross_entropy(input, weight, target, bias=None, ignore_index: int = -100, label_smoothing: float = 0.0,
                         reduction: str = "mean"):
    """`F.cross_entropy(F.linear(input, weight, bias), target, ...)` as one op (load an export first),
    a class index a row of `input`: input [..., H] with target [...] of its leading shape, as a model's
    hidden states [batch, seq, H] and labels [batch, seq] (each token its own row, as LLM code flattens
    them; torch's two would read a 3-D input's dim 1 as the classes). A CUDA call of that form
    without a bias (input and weight alike in the op's dtypes, an int64 target, arguments torch
    accepts) goes to the op; any other call of that form to torch's two, rows flattened the same way;
    every other call (a 1-D or 2-D input with any target torch takes: class probabilities, an
    unbatched row) to torch's two as given, with their answers and their errors."""
    import torch

    tensors = isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)
    rows = tensors and input.dim() >= 1 and target.shape == input.shape[:-1]  # a class index a row
    if (rows and input.is_cuda and bias is None and isinstance(weight, torch.Tensor)
            and input.dtype in runtime.dtypes(DTYPES) and weight.dtype == input.dtype and target.dtype == torch.int64
            and weight.device == input.device == target.device
            and reduction in REDUCTIONS and 0.0 <= label_smoothing <= 1.0):
        loss = runtime.entry("linear_cross_entropy")(input.reshape(-1, input.shape[-1]), weight, target.reshape(-1),
                                                      ignore_index, float(label_smoothing), reduction)
        return loss.reshape(target.shape) if reduction == "none" else loss
    import torch.nn.functional as F

    if not (rows and input.dim() > 2):  # torch's two mean the same as the op here, or refuse it
        return F.cross_entropy(F.linear(input, weight, bias), target, ignore_index=ignore_index,
                               reduction=reduction, label_smoothing=label_smoothing)
    return F.cross_entropy(F.linear(input, weight, bias).flatten(0, -2), target.flatten(), ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=label_smoothing).reshape(
        target.shape if reduction == "none" else ())


FUNCTIONS = {"linear_cross_entropy": linear_cross_entropy}
# torch's path holds the whole logits and their gradient: variants serve every shape (the nearest tuned
# problem's parameters), torch's op only where the export's check found it faster at a tuned problem
OP = opspec.spec(OP_DECLARATION, "linear_cross_entropy", reference=reference, torch_op=torch_linear_cross_entropy,
                 unfused=lambda problem: True)
