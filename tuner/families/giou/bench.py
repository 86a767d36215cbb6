"""GIoU loss implementations side by side, in one run on one GPU (`tuner bench --family giou`).

Every implementation computes the same thing, 1 - GIoU averaged over the valid
boxes (torchvision's eps): the article's own loss is the mean GIoU and does its
arithmetic on uint8 targets, which overflows, so its loop, concatenation and
padded forms are written here with float32 math on upcast targets. Each is
checked against the float64 reference (forward and gradient) before it is timed.

Anchors from the same run: one kernel launch through the dispatcher,
`x.sum().backward()` on a [B, S, 4] leaf (autograd's own cost), and `F.mse_loss` on
two [B, S, 4] float32 tensors (a native C++ loss with C++ autograd: what a call of an
op costs when no Python runs on its path). The tuned op is also timed with its other
two ways of reporting bad input (validate="sync" and "deferred"), and inside
`torch.compile(mode="reduce-overhead")` (CUDA graphs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from tuner import runtime
from tuner.report.bench import _fmt, kernel_us, no_grad, wall_us, write
from tuner.families import giou

EPS = 1e-7


def giou_1m(p, t):
    """1 - GIoU of matching boxes, float32 math."""
    return giou.giou_loss_elementwise(p.float(), t.float(), EPS)


def loop_loss(pred, targets_list):
    """The article's per-sample loop (its loss_fn), as 1 - GIoU."""
    total, count = 0.0, 0
    for i, targets in enumerate(targets_list):
        n = targets.shape[0]
        if n > 0:
            total = total + giou_1m(pred[i, :n], targets).sum()
            count += n
    return total / max(count, 1)


def concat_loss(pred, targets_list, mask):
    """The article's concatenation: gather the valid predictions, one call on the flat boxes."""
    return giou_1m(pred[mask], torch.cat(targets_list)).mean()


def padded_loss(pred, target, num_boxes):
    """The article's padded form: every slot, masked, averaged over the valid ones."""
    mask = torch.arange(pred.shape[1], device=pred.device)[None, :] < num_boxes[:, None]
    loss = giou_1m(pred, target)
    return torch.where(mask, loss, 0).sum() / mask.sum().clamp(min=1)


def torchvision_loss(pred, target, num_boxes):
    from torchvision.ops import generalized_box_iou_loss

    mask = torch.arange(pred.shape[1], device=pred.device)[None, :] < num_boxes[:, None]
    loss = generalized_box_iou_loss(pred.float(), target.float(), reduction="none", eps=EPS)
    return torch.where(mask, loss, 0).sum() / mask.sum().clamp(min=1)


class SimpleKernel:
    """The article's single CUDA kernel: one thread per slot, fp32 math, the sums done apart."""

    def __init__(self, pred_dtype: str, target_dtype: str):
        from tuner import gpus
        from tuner.build import compile as build
        from tuner.measure.declared import DeclaredKernel

        v = giou.space(pred_dtype, target_dtype).variant(
            boxes_per_thread=1, padding="branch", validation="none", block_size=256, loads="scalar",
            reduction="atomic", backward="recompute")
        (b,) = build.build([v], gpus.attached().arch, serving=True)  # timed from the host too
        self.kernel = DeclaredKernel(giou.FAMILY, b.so, v.name, b.entry)

    @staticmethod
    def values(pred, target, num_boxes) -> dict:
        """The op's inputs by name, per-box losses wanted (reduced by torch ops after it)."""
        return {"pred": pred, "target": target, "num_boxes": num_boxes, "reduction": "none", "eps": EPS}

    def __call__(self, pred, target, num_boxes):
        k = self

        class Fn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, p):
                outs = k.kernel.forward(k.values(p, target, num_boxes), check=False)
                ctx.save_for_backward(p, outs["count"])
                return outs["loss"]

            @staticmethod
            def backward(ctx, g):
                p, count = ctx.saved_tensors
                saved = {"count": count, "saved_grad": None}  # a variant that recomputes saves no gradient
                call, grads = k.kernel.prepare_backward({"loss": g}, k.values(p, target, num_boxes), saved)
                call()
                return grads["pred"]

        per_box = Fn.apply(pred)
        return per_box.sum() / num_boxes.clamp(0, pred.shape[1]).sum().clamp(min=1)


# -------------------------------------------------------------------- suite

def implementations(op, pred_dtype: str, target_dtype: str) -> dict[str, Callable]:
    """name -> f(pred, target, num_boxes, targets_list, mask) -> loss."""
    compiled = torch.compile(padded_loss)
    simple = SimpleKernel(pred_dtype, target_dtype)
    return {
        "tuned op": lambda p, t, n, tl, m: op(p, t, n),
        "article loop": lambda p, t, n, tl, m: loop_loss(p, tl),
        "article concat": lambda p, t, n, tl, m: concat_loss(p, tl, m),
        "padded eager": lambda p, t, n, tl, m: padded_loss(p, t, n),
        "torch.compile padded": lambda p, t, n, tl, m: compiled(p, t, n),
        "torchvision + mask": lambda p, t, n, tl, m: torchvision_loss(p, t, n),
        "simple CUDA kernel": lambda p, t, n, tl, m: simple(p, t, n),
    }


def reduce_overhead(op) -> Callable:
    """The tuned op inside torch.compile(mode="reduce-overhead"): its calls replay CUDA graphs.
    Made per shape, so that no recompilation limit turns it back into eager calls."""
    compiled = torch.compile(lambda p, t, n: op(p, t, n), mode="reduce-overhead", dynamic=False)
    return lambda p, t, n, tl, m: compiled(p, t, n)


# Rows timed with the tuned op switched to another way of reporting bad input.
VALIDATE_ROWS = {"tuned op, validate=sync": "sync", "tuned op, validate=deferred": "deferred"}


LOOP_MAX_BATCH = 1024  # the per-sample loop takes seconds a call beyond this; left out there


def bench(directory, args) -> list[dict]:
    """`tuner bench --family giou`: the export in `directory` at each of --batches and --dtypes."""
    import tuner

    return run(tuner.load(directory), args.batches, args.dtypes, out=args.out)


def run(op, batches=(64, 256, 1024, 4096), dtypes=(("bfloat16", "uint8"), ("float32", "float32")),
        slots: int = 256, out: Path | None = None) -> list[dict]:
    rows = []
    one = torch.zeros(1, device="cuda")
    for pred_dtype, target_dtype in dtypes:
        impls = implementations(op, pred_dtype, target_dtype)
        for B in batches:
            pred, target, counts = giou.make_inputs(B, slots, pred_dtype, target_dtype, "article", device="cuda",
                                                    seed=B)
            mask = torch.arange(slots, device="cuda")[None, :] < counts[:, None]
            targets_list = [target[i, : int(c)] for i, c in enumerate(counts.tolist())]
            want, want_grad = giou.reference_with_grad(pred, target, counts, "mean")
            leaf_floor = torch.randn(B, slots, 4, device="cuda", requires_grad=True)
            x, y = torch.rand(B, slots, 4, device="cuda"), torch.rand(B, slots, 4, device="cuda")
            leaf_x = x.clone().requires_grad_(True)

            def mse_fwd_bwd():
                leaf_x.grad = None
                F.mse_loss(leaf_x, y).backward()

            floors = {
                "floor: one kernel launch": (lambda: one.fill_(1.0), None),
                "floor: x.sum().backward()": (None, lambda: leaf_floor.sum().backward()),
                "anchor: F.mse_loss (native op)": (lambda: F.mse_loss(x, y), mse_fwd_bwd),
            }
            tuned = impls["tuned op"]
            cases = {**impls, **{name: tuned for name in VALIDATE_ROWS},
                     "tuned op, torch.compile reduce-overhead": reduce_overhead(op)}
            for name, fn in cases.items():
                if name == "article loop" and B > LOOP_MAX_BATCH:
                    continue
                leaf = pred.clone().requires_grad_(True)
                loss = fn(leaf, target, counts, targets_list, mask)
                loss.backward()
                ok_l = giou.check("loss", loss, want, 1e-4)[0]
                ok_g = giou.check("grad", leaf.grad, want_grad, giou.GRAD_TOL[pred_dtype],
                                  getattr(torch, pred_dtype))[0]
                if not (ok_l and ok_g):
                    raise AssertionError(f"{name} B={B} {pred_dtype}/{target_dtype} disagrees with the reference")

                def fwd(fn=fn):
                    return fn(pred, target, counts, targets_list, mask)

                def fwd_bwd(fn=fn, leaf=leaf):
                    leaf.grad = None
                    fn(leaf, target, counts, targets_list, mask).backward()

                floors[name] = (fwd, fwd_bwd)
            fwd_wall = wall_us({name: (no_grad(f), VALIDATE_ROWS.get(name, "async"))
                                for name, (f, _) in floors.items() if f is not None})
            fwd_bwd_wall = wall_us({name: (fb, VALIDATE_ROWS.get(name, "async"))
                                    for name, (_, fb) in floors.items() if fb is not None})
            for name, (f, fb) in floors.items():
                row = {"impl": name, "pred": pred_dtype, "target": target_dtype, "B": B, "S": slots}
                runtime.set_validate(VALIDATE_ROWS.get(name, "async"))
                if f is not None:
                    row["fwd_wall_us"] = fwd_wall[name]
                    row["fwd_kernel_us"] = kernel_us(no_grad(f))
                if fb is not None:
                    row["fwd_bwd_wall_us"] = fwd_bwd_wall[name]
                    row["fwd_bwd_kernel_us"] = kernel_us(fb)
                runtime.set_validate("async")
                rows.append(row)
                print(_fmt(row), flush=True)
    if out is not None:
        write(rows, out, size="B")
    return rows


