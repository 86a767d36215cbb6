"""Check a compiled GIoU variant against the float64 reference on random inputs.

A `Case` is a set of inputs and their float64 answers (loss and gradient). Making
one costs more than running a variant on it (the reference is autograd in float64),
so a search makes a few and shares each between several variants (see
`Evaluation.check`); `verify` makes a fresh one for a single check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.families import giou


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str  # "", "nan" or "wrong result"
    message: str
    loss_error: float
    grad_error: float


@dataclass
class Case:
    pred: Any
    target: Any
    num_boxes: Any  # None: validity from the targets
    reduction: str
    grad_out: Any
    want_loss: Any
    want_grad: Any
    count: float  # valid boxes
    grad_tol: float  # the dtype's tolerance plus what rounding the exact gradient to it costs
    where: str


def make_case(pred: str, target: str, batch: int, slots: int, reduction: str = "mean",
              distribution: str = "article", counts=None, use_counts: bool = True, device="cuda",
              seed: int | None = None) -> Case:
    import torch

    p, t, n = giou.make_inputs(batch, slots, pred, target, distribution, device=device, counts=counts, seed=seed)
    nb = n if use_counts else None
    shape = (batch, slots) if reduction == "none" else ()
    grad_out = torch.rand(shape, device=device, dtype=torch.float32) + 0.5
    want_loss, want_grad = giou.reference_with_grad(p, t, nb, reduction, grad_out=grad_out)
    count = giou.valid_mask(t, nb).sum().item()
    dtype = giou.dtype_name(pred)
    grad_tol = giou.GRAD_TOL[dtype] + 2 * giou.relative_error(want_grad.to(getattr(torch, dtype)), want_grad)
    return Case(p, t, nb, reduction, grad_out, want_loss, want_grad, count, grad_tol,
                f"B={batch} S={slots} {reduction}: ")


def run_case(kernel, case: Case) -> Verdict:
    """Forward and backward on the case's inputs, outputs poisoned with NaN first.

    CUDA errors (illegal address, assert, launch failure) propagate as exceptions:
    the caller decides what a dead context means.
    """
    import torch

    p, red = case.pred, case.reduction
    nan = float("nan")
    f32 = dict(device=p.device, dtype=torch.float32)
    out = torch.full(case.want_loss.shape, nan, **f32)
    count = torch.full((), nan, **f32)
    saved = torch.full(p.shape, nan, **f32) if kernel.saves_grad else torch.empty(0, **f32)
    loss, count, saved = kernel.forward(p, case.target, case.num_boxes, red, out=out, count=count,
                                        saved_grad=saved, need_grad=True)
    grad = kernel.backward(case.grad_out, p, case.target, case.num_boxes, count, saved, red,
                           grad_pred=torch.full_like(p, nan))
    ok_l, err_l, msg_l = giou.check("loss", loss, case.want_loss, giou.LOSS_TOL)
    ok_g, err_g, msg_g = giou.check("grad", grad, case.want_grad, case.grad_tol)
    if red != "none" and count.item() != case.count:
        return Verdict(False, "wrong result", case.where + f"count {count.item()} is wrong", err_l, err_g)
    if ok_l and ok_g:
        return Verdict(True, "", case.where + f"{msg_l}; {msg_g}", err_l, err_g)
    finite = bool(torch.isfinite(loss).all() and torch.isfinite(grad).all())
    return Verdict(False, "wrong result" if finite else "nan", case.where + f"{msg_l}; {msg_g}", err_l, err_g)


def verify(kernel, pred: str, target: str, batch: int, slots: int, reduction: str = "mean",
           distribution: str = "article", counts=None, use_counts: bool = True, device="cuda") -> Verdict:
    """One check on fresh inputs."""
    return run_case(kernel, make_case(pred, target, batch, slots, reduction, distribution, counts, use_counts,
                                      device))
