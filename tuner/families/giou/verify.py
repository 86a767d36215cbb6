"""Check a compiled GIoU variant against the float64 reference on fresh random inputs."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.families import giou


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str  # "", "nan" or "wrong result"
    message: str
    loss_error: float
    grad_error: float


def verify(kernel, pred: str, target: str, batch: int, slots: int, reduction: str = "mean",
           distribution: str = "article", counts=None, use_counts: bool = True, device="cuda") -> Verdict:
    """Forward and backward on fresh inputs, outputs poisoned with NaN first.

    CUDA errors (illegal address, assert, launch failure) propagate as exceptions:
    the caller decides what a dead context means.
    """
    import torch

    p, t, n = giou.make_inputs(batch, slots, pred, target, distribution, device=device, counts=counts)
    nb = n if use_counts else None
    nan = float("nan")
    f32 = dict(device=device, dtype=torch.float32)
    out = torch.full((batch, slots) if reduction == "none" else (), nan, **f32)
    count = torch.full((), nan, **f32)
    saved = torch.full(p.shape, nan, **f32) if kernel.saves_grad else torch.empty(0, **f32)
    loss, count, saved = kernel.forward(p, t, nb, reduction, out=out, count=count, saved_grad=saved,
                                        need_grad=True)
    grad_out = torch.rand(loss.shape, **f32) + 0.5
    grad = kernel.backward(grad_out, p, t, nb, count, saved, reduction, grad_pred=torch.full_like(p, nan))
    torch.cuda.synchronize()
    want_loss, want_grad = giou.reference_with_grad(p, t, nb, reduction, grad_out=grad_out)
    ok_l, err_l, msg_l = giou.check("loss", loss, want_loss, giou.LOSS_TOL)
    ok_g, err_g, msg_g = giou.check("grad", grad, want_grad, giou.GRAD_TOL[giou.dtype_name(pred)],
                                    getattr(torch, giou.dtype_name(pred)))
    where = f"B={batch} S={slots} {reduction}: "
    if reduction != "none" and count.item() != giou.valid_mask(t, nb).sum().item():
        return Verdict(False, "wrong result", where + f"count {count.item()} is wrong", err_l, err_g)
    if ok_l and ok_g:
        return Verdict(True, "", where + f"{msg_l}; {msg_g}", err_l, err_g)
    finite = bool(torch.isfinite(loss).all() and torch.isfinite(grad).all())
    return Verdict(False, "wrong result" if finite else "nan", where + f"{msg_l}; {msg_g}", err_l, err_g)
