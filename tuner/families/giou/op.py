"""The GIoU family's op, `torch.ops.tuner.giou_loss`, as the runtime binds it (torch alone).

The op lives in C++ (templates/giou/giou_op.cpp, part of the binding built once per
torch/CUDA version), as pytorch/extension-cpp does it: its schema, its CUDA kernels,
its autograd (a `torch::autograd::Function` calling the backward kernel) and its
input checks, so that an eager call is one dispatcher hop and runs no Python:

    tuner::giou_loss(pred, target, num_boxes=None, reduction="mean", eps=1e-7) -> Tensor
        CUDA and Autograd kernels in C++; the Autograd kernel calls the two below
    tuner::giou_loss_forward(pred, target, num_boxes, reduction, eps) -> (loss, count, saved_grad)
    tuner::giou_loss_backward(grad, pred, target, num_boxes, count, saved_grad, reduction, eps) -> grad_pred

Each winner is staged with its tuned shape (each call picks, in C++, the winner of its dtype
pair nearest to its shape). What stays in Python is off the CUDA path: the CPU
implementation (the float64 reference) and the fake implementation for torch.compile. This
module and spec.py import nothing from tuner but the runtime (relatively), so an exported
wheel carries them as they are.
"""

from __future__ import annotations

from ... import runtime
from .spec import C10_NAMES, DEFAULT_EPS, PRED_DTYPES, REDUCTIONS, TARGET_DTYPES, reference, reference_with_grad, valid_mask

NAMESPACE = "tuner_giou"  # the binding's own ops: stage, publish, set_check, take_errors, ...


def generalized_box_iou_loss(boxes1, boxes2, reduction: str = "none", eps: float = 1e-7):
    """`torchvision.ops.generalized_box_iou_loss`'s signature and meaning on the tuned op (load an
    export first): boxes [N, 4] or [4], every box a real one (no padding), the loss in float32
    (float64 for float64 boxes), as torchvision gives it. A CUDA call in the op's dtypes, with no gradient wanted for boxes2, goes to
    `torch.ops.tuner.giou_loss` as one image of N boxes; every other call is computed as
    torchvision writes it (spec.giou_loss_elementwise)."""
    import torch

    from .spec import giou_loss_elementwise

    if reduction not in REDUCTIONS:  # torchvision's words
        raise ValueError(f"Invalid Value for arg 'reduction': '{reduction} \n Supported reduction modes: "
                         "'none', 'mean', 'sum'")
    named = boxes1.dtype in runtime.dtypes(PRED_DTYPES) and boxes2.dtype in runtime.dtypes(TARGET_DTYPES)
    if not (boxes1.is_cuda and named and boxes1.shape == boxes2.shape and boxes1.dim() in (1, 2)
            and boxes1.shape[-1] == 4 and boxes2.device == boxes1.device and not boxes2.requires_grad):
        def upcast(t):  # torchvision's _upcast_non_float: anything but float32/float64 computes in float32
            return t if t.dtype in (torch.float32, torch.float64) else t.float()
        loss = giou_loss_elementwise(upcast(boxes1), upcast(boxes2), eps)
        if reduction == "none":
            return loss
        if reduction == "sum":
            return loss.sum()
        return loss.mean() if loss.numel() else 0.0 * loss.sum()
    n = boxes1.numel() // 4  # the op's loss is float32, as torchvision's is for these dtypes
    loss = torch.ops.tuner.giou_loss(boxes1.reshape(1, n, 4), boxes2.reshape(1, n, 4), _count(n, boxes1.device),
                                     reduction, eps)
    return loss.reshape(boxes1.shape[:-1]) if reduction == "none" else loss


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


# ----------------------------------------------- CPU and fake

def _check_inputs(pred, target, num_boxes) -> None:
    """The C++ kernels' checks and messages (templates/giou/giou_op.cpp), for the CPU and fake paths."""
    import torch

    if pred.dim() != 3 or pred.shape[-1] != 4:
        raise ValueError(f"giou_loss: pred must have shape [B, S, 4], got {list(pred.shape)}")
    if target.shape != pred.shape:
        raise ValueError(f"giou_loss: target {list(target.shape)} must have pred's shape {list(pred.shape)}")
    if str(pred.dtype).removeprefix("torch.") not in PRED_DTYPES:
        raise TypeError(f"giou_loss: pred must be float32, float16 or bfloat16, got {pred.dtype}")
    if str(target.dtype).removeprefix("torch.") not in TARGET_DTYPES:
        raise TypeError(f"giou_loss: target must be uint8, float16, bfloat16 or float32, got {target.dtype}")
    if target.device != pred.device:
        raise ValueError(f"giou_loss: pred is on {pred.device} but target is on {target.device}")
    if num_boxes is not None:
        if num_boxes.device != pred.device:
            raise ValueError(f"giou_loss: num_boxes is on {num_boxes.device} but pred is on {pred.device}")
        if num_boxes.dtype.is_floating_point or num_boxes.dtype == torch.bool or num_boxes.is_complex():
            raise TypeError(f"giou_loss: num_boxes must be an integer tensor, got {num_boxes.dtype}")
        if num_boxes.dim() != 1 or num_boxes.shape[0] != pred.shape[0]:
            raise ValueError(f"giou_loss: num_boxes must have shape [B] = [{pred.shape[0]}], "
                             f"got {list(num_boxes.shape)}")


def _check_values(target, num_boxes) -> None:
    """What a validating kernel reports, checked at once on CPU (where it costs no sync)."""
    import torch

    S = target.shape[1]
    if num_boxes is not None and num_boxes.numel() and bool(((num_boxes < 0) | (num_boxes > S)).any()):
        raise runtime.KernelInputError("giou_loss: invalid input: num_boxes has a value outside [0, S]")
    if target.dtype.is_floating_point:
        valid = valid_mask(target, num_boxes)
        if bool((~torch.isfinite(target).all(-1) & valid).any()):
            raise runtime.KernelInputError("giou_loss: invalid input: a valid target box has a non-finite coordinate")


def _saved_shape(pred, target) -> tuple:
    """[B, S, 4] when the bound winners of this dtype pair save a gradient (the C++ forward's rule)."""
    import torch

    names = [C10_NAMES.get(str(t.dtype).removeprefix("torch."), "") for t in (pred, target)]
    if not getattr(torch.ops, NAMESPACE).saves(*names):
        return (0,)
    return (pred.shape[0], pred.shape[1], 4)


def _forward_cpu(pred, target, num_boxes, reduction: int, eps: float):
    import torch

    _check_inputs(pred, target, num_boxes)
    _check_values(target, num_boxes)
    loss = reference(pred, target, num_boxes, REDUCTIONS[reduction], eps).to(torch.float32)
    count = valid_mask(target, num_boxes).sum().to(torch.float32)
    # The reference recomputes in backward; a saved gradient is only shaped like the kernel's.
    return loss, count, torch.zeros(_saved_shape(pred, target), dtype=torch.float32, device=pred.device)


def _loss_cpu(pred, target, num_boxes=None, reduction="mean", eps=DEFAULT_EPS):
    return _forward_cpu(pred, target, num_boxes, _reduction_code(reduction), eps)[0]


def _backward_cpu(grad, pred, target, num_boxes, count, saved, reduction: int, eps: float):
    _, g = reference_with_grad(pred, target, num_boxes, REDUCTIONS[reduction], eps, grad_out=grad)
    return g.to(pred.dtype).contiguous()


def _reduction_code(reduction: str) -> int:
    if reduction not in REDUCTIONS:
        raise ValueError(f"giou_loss: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return REDUCTIONS.index(reduction)


def _forward_fake(pred, target, num_boxes, reduction: int, eps: float):
    import torch

    _check_inputs(pred, target, num_boxes)
    B, S = pred.shape[0], pred.shape[1]
    f32 = torch.float32
    loss = pred.new_empty((B, S) if reduction == 0 else (), dtype=f32)
    return loss, pred.new_empty((), dtype=f32), pred.new_empty(_saved_shape(pred, target), dtype=f32)


def _loss_fake(pred, target, num_boxes=None, reduction="mean", eps=DEFAULT_EPS):
    return _forward_fake(pred, target, num_boxes, _reduction_code(reduction), eps)[0]


def _pair(problem: dict) -> int:
    """A dtype pair's index, as giou_op.cpp's pair_of numbers it."""
    return PRED_DTYPES.index(problem["pred"]) * 4 + TARGET_DTYPES.index(problem["target"])


# The baseline, the eager GIoU loss (spec.eager, in ATen ops in giou_op.cpp), serves the problems where
# no variant beat it. Other shapes and untuned dtype pairs run the nearest tuned parameters: the eager
# loss is a dozen kernels, and it does not validate what the kernels validate (counts, finite targets).
OP = runtime.OpSpec(
    family="giou", op="giou_loss", namespace=NAMESPACE, abi=2,
    shape=lambda problem: ([problem["batch"], problem["slots"]], 0),
    baseline=True, reach=0.0, pair=_pair, untuned_by_baseline=False,
    impls={"giou_loss": (_loss_cpu, _loss_fake),
           "giou_loss_forward": (_forward_cpu, _forward_fake),
           "giou_loss_backward": (_backward_cpu, lambda grad, pred, *rest: pred.new_empty(pred.shape))})
