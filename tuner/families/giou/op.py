"""The GIoU family's op, declared: `torch.ops.tuner.giou_loss(pred, target, num_boxes=None,
reduction="mean", eps=1e-7)`; the core renders its C++ (schema, checks, the CUDA kernels of the
op and of its backward, the autograd function: one dispatcher hop, no Python on the call path)
and its C ABI from OP_DECLARATION (tuner/build/declared.py), its CPU and fake kernels from the
float64 reference (tuner/opspec.py). This module and spec.py import nothing from tuner but the
runtime, declare and opspec (relatively), so an exported wheel carries them as they are."""

from __future__ import annotations

import functools

from ... import declare, opspec, runtime
from .spec import DEFAULT_EPS, PRED_DTYPES, REDUCTIONS, TARGET_DTYPES, eager, reference, valid_mask

BAD_COUNT = "num_boxes has a value outside [0, S]"
BAD_TARGET = "a valid target box has a non-finite coordinate"

OP_DECLARATION = declare.Op(
    "giou_loss",
    inputs=(declare.Tensor("pred", dtypes=PRED_DTYPES),
            declare.Tensor("target", dtypes=TARGET_DTYPES, grad=False, shape=("batch", "slots", 4)),
            # valid slots of each image (any integer dtype); left out, a slot is valid where its target's y2 > 0
            declare.Tensor("num_boxes", dtypes=("int64",), grad=False, shape=("batch",), optional="null",
                           converts=True),
            declare.Scalar("reduction", "str", "mean", choices=REDUCTIONS),
            declare.Scalar("eps", "float", DEFAULT_EPS)),
    outputs=(declare.Tensor("loss", dtypes=("float32",), shape=("batch", "slots"), reduced_by="reduction"),),
    sizes={"batch": "pred.size(0)", "slots": "pred.size(1)"},
    checks=(("pred.dim() == 3", "pred must have shape [B, S, 4]"), ("pred.size(2) == 4", "pred must have shape [B, S, 4]"),
            ("pred.numel() < 2147483647", "at most 536870911 boxes a call")),  # the kernels index boxes by int
    errors=(("bad_count", BAD_COUNT), ("bad_target", BAD_TARGET)),  # found by a validating variant's forward
    abi=3,
    saves=(declare.Tensor("count", dtypes=("float32",), shape=()),  # valid boxes (a mean's divisor)
           # d loss_i / d pred, written by a fused variant's forward
           declare.Tensor("saved_grad", dtypes=("float32",), shape=("batch", "slots", 4), only_if="saves_grad")),
    table=("int alignment", "int saves_grad", "long long (*workspace_words)(long long batch, long long slots)"),
    workspace="vt->workspace_words(sizes[0], sizes[1])",  # a last block's ticket, sums and partials
    # The eager loss (spec.eager): torchvision's formula in float32 ATen ops, padding slots a unit box
    # before the math, counts clamped to [0, S]. It validates nothing, as torch's composite would not.
    baseline="""
        const auto f32 = pred.options().dtype(at::kFloat);
        const at::Tensor valid = num_boxes.has_value()
            ? at::arange(pred.size(1), pred.options().dtype(at::kLong)).unsqueeze(0)
                  < num_boxes->to(at::kLong).clamp(0, pred.size(1)).unsqueeze(1)
            : target.select(-1, 3) > 0;
        const at::Tensor unit = (at::arange(4, f32) >= 2).to(at::kFloat), v4 = valid.unsqueeze(-1);
        const at::Tensor p = at::where(v4, pred.to(at::kFloat), unit), t = at::where(v4, target.to(at::kFloat), unit);
        const at::Tensor x1 = p.select(-1, 0), y1 = p.select(-1, 1), x2 = p.select(-1, 2), y2 = p.select(-1, 3);
        const at::Tensor x1g = t.select(-1, 0), y1g = t.select(-1, 1), x2g = t.select(-1, 2), y2g = t.select(-1, 3);
        const at::Tensor xk1 = at::maximum(x1, x1g), yk1 = at::maximum(y1, y1g);
        const at::Tensor xk2 = at::minimum(x2, x2g), yk2 = at::minimum(y2, y2g);
        const at::Tensor inter = at::where((yk2 > yk1) & (xk2 > xk1), (xk2 - xk1) * (yk2 - yk1), at::zeros_like(x1));
        const at::Tensor uni = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - inter;
        const at::Tensor iou = inter / (uni + eps);
        const at::Tensor area = (at::maximum(x2, x2g) - at::minimum(x1, x1g)) * (at::maximum(y2, y2g) - at::minimum(y1, y1g));
        const at::Tensor loss = at::where(valid, 1 - (iou - (area - uni) / (area + eps)), at::zeros_like(x1));
        if (reduction == "none") return loss;
        if (reduction == "sum") return loss.sum();
        return loss.sum() / valid.sum().clamp_min(1).to(at::kFloat);""",
)


def generalized_box_iou_loss(boxes1, boxes2, reduction: str = "none", eps: float = 1e-7):
    """`torchvision.ops.generalized_box_iou_loss`'s signature and meaning on the tuned op (load an
    export first): boxes [N, 4] or [4], every box a real one (no padding), the loss in float32
    (float64 for float64 boxes), as torchvision gives it. A CUDA call in the op's dtypes, with no gradient wanted for boxes2, goes to
    `torch.ops.tuner.giou_loss` as one image of N boxes; every other call to torchvision's function
    itself, or, where torchvision is not installed, computed as it writes it (spec.giou_loss_elementwise)."""
    import torch

    from .spec import giou_loss_elementwise

    if reduction not in REDUCTIONS:  # torchvision's words
        raise ValueError(f"Invalid Value for arg 'reduction': '{reduction} \n Supported reduction modes: "
                         "'none', 'mean', 'sum'")
    named = boxes1.dtype in runtime.dtypes(PRED_DTYPES) and boxes2.dtype in runtime.dtypes(TARGET_DTYPES)
    if not (boxes1.is_cuda and named and boxes1.shape == boxes2.shape and boxes1.dim() in (1, 2)
            and boxes1.shape[-1] == 4 and boxes2.device == boxes1.device and not boxes2.requires_grad):
        torchvision_s = _torchvision_loss()
        if torchvision_s is not None:  # its answers, gradients and refusals
            return torchvision_s(boxes1, boxes2, reduction, eps)

        def upcast(t):  # torchvision's _upcast_non_float: anything but float32/float64 computes in float32
            return t if t.dtype in (torch.float32, torch.float64) else t.float()
        loss = giou_loss_elementwise(upcast(boxes1), upcast(boxes2), eps)
        if reduction == "none":
            return loss
        if reduction == "sum":
            return loss.sum()
        return loss.mean() if loss.numel() else 0.0 * loss.sum()
    n = boxes1.numel() // 4  # the op's loss is float32, as torchvision's is for these dtypes
    loss = runtime.entry("giou_loss")(boxes1.reshape(1, n, 4), boxes2.reshape(1, n, 4), _count(n, boxes1.device),
                                        reduction, eps)
    return loss.reshape(boxes1.shape[:-1]) if reduction == "none" else loss


@functools.cache
def _torchvision_loss():
    """torchvision's generalized_box_iou_loss where it is installed, else None (looked up once: a
    failed import searches the path again at every call)."""
    try:
        from torchvision.ops import generalized_box_iou_loss
    except ImportError:
        return None
    return generalized_box_iou_loss


_counts: dict = {}


def _count(n: int, device):
    """num_boxes [1] = n on the device, made once per (n, device) so that a call pays no fill: a
    plain tensor even under inference_mode (a later training call saves it for backward), and
    not kept when made inside a CUDA graph's capture (it holds n only once the graph runs)."""
    import torch

    key = (n, device)
    if key in _counts:
        return _counts[key]
    with torch.inference_mode(False):
        count = torch.full((1,), n, dtype=torch.int32, device=device)
    if not torch.cuda.is_current_stream_capturing():
        if len(_counts) > 256:
            _counts.clear()
        _counts[key] = count
    return count


FUNCTIONS = {"generalized_box_iou_loss": generalized_box_iou_loss}


# ----------------------------------------------- CPU

def _check_values(target, num_boxes) -> None:
    """What a validating kernel reports, checked at once on CPU (where it costs no sync)."""
    import torch

    S = target.shape[1]
    if num_boxes is not None and num_boxes.numel() and bool(((num_boxes < 0) | (num_boxes > S)).any()):
        raise runtime.KernelInputError(f"giou_loss: invalid input: {BAD_COUNT}")
    if target.dtype.is_floating_point:
        valid = valid_mask(target, num_boxes)
        if bool((~torch.isfinite(target).all(-1) & valid).any()):
            raise runtime.KernelInputError(f"giou_loss: invalid input: {BAD_TARGET}")


def _reference(pred, target, num_boxes=None, reduction: str = "mean", eps: float = DEFAULT_EPS):
    """The CPU op's: the float64 reference, after the checks a validating kernel makes."""
    _check_values(target, num_boxes)
    return reference(pred, target, num_boxes, reduction, eps)


# The baseline, the eager loss, serves the problems where no variant beat it. Other shapes and
# untuned dtype pairs run the nearest tuned parameters: the eager loss is a dozen kernels, and it
# does not validate what the kernels validate (counts, finite targets).
OP = opspec.spec(OP_DECLARATION, "giou", reference=_reference, torch_op=eager, untuned_by_baseline=False)
