"""The GIoU loss family: search space, rendering context, float64 reference and inputs.

The op: `pred` [B, S, 4] and `target` [B, S, 4] boxes (x1, y1, x2, y2). Slot j of
image b is valid iff j < num_boxes[b] when `num_boxes` is given, else iff
target[b, j, 3] > 0 (padding targets are zero). Per valid box the loss is
1 - GIoU exactly as `torchvision.ops.generalized_box_iou_loss` (same eps);
`mean` averages over valid boxes (0, with zero gradient, when there are none),
`sum` adds them, `none` returns [B, S] with 0 at padding. Math is float32 whatever
the storage dtype; the loss is float32, the gradient has pred's dtype.
"""

from __future__ import annotations

import importlib.util

from tuner.space import Constraint, Dim, Space, fixed_spaces, dtype_name, kernel_arg, option, problem_class  # noqa: F401

FAMILY = "giou"  # giou.cu.j2 by convention (tuner.families.conventions); its op is declared (op.py)

from tuner.families.giou.op import OP_DECLARATION  # noqa: F401 (the op: its C++ and C ABI are rendered from it)
from tuner.families.giou.spec import (DEFAULT_EPS, PRED_DTYPES, REDUCTIONS, TARGET_DTYPES,  # noqa: F401
                                      giou_loss_elementwise, reference, valid_mask)

DIMS = (
    Dim("boxes_per_thread", (1, 2, 4, 8), "boxes each thread handles"),
    Dim("padding", ("branch", "predicate"), "skip padding slots with a branch, or compute and select"),
    Dim("validation", ("none", "inline", "hoisted", "kernel"), "where num_boxes/target checks sit"),
    Dim("block_size", (64, 128, 256, 512, 1024), "threads per block"),
    Dim("loads", ("scalar", "vector"), "four element loads per box, or one vector load"),
    Dim("reduction", ("atomic", "two_pass"), "fused reduction: float atomics, or deterministic partials"),
    Dim("backward", ("recompute", "fused"), "backward recomputes, or forward saves d loss / d pred"),
)

CONSTRAINTS = (
    Constraint(
        "hoisted validation needs a loop to hoist out of (boxes_per_thread >= 2)",
        lambda p: p["validation"] != "hoisted" or p["boxes_per_thread"] >= 2,
    ),
    Constraint(
        "a block covers at most 4096 boxes (block_size * boxes_per_thread <= 4096)",
        lambda p: p["block_size"] * p["boxes_per_thread"] <= 4096,
    ),
)

# Opt-in kinds of variant, a switch each on the command line (tuner.cli.target): space(device_assert=True).
SPACE_FLAGS = {"device_assert": "variants that also stop on a device-side assert when validation fails (opt-in)"}

# Faults a test can plant in a variant, to check that a search survives them.
FAULTS = ("compile", "oob", "assert", "hang", "wrong", "nan", "resources")


def space(pred: str = "bfloat16", target: str = "uint8", device_assert: bool = False) -> Space:
    """The variants for one dtype pair; the dtypes are the problem, not tuned."""
    pred, target = dtype_name(pred, PRED_DTYPES, "pred"), dtype_name(target, TARGET_DTYPES, "target")
    return Space(
        FAMILY, {"pred": pred, "target": target}, DIMS, CONSTRAINTS,
        flags={"device_assert": device_assert, "fault": None},
    )


space_for, all_spaces, covering_set = fixed_spaces(space, pred=PRED_DTYPES, target=TARGET_DTYPES)
KERNEL_ARGS, search_focus = kernel_arg(OP_DECLARATION, "reduction")  # the kernels' template argument


# ------------------------------------------------------------------- inputs

DISTRIBUTIONS = ("article", "uniform", "full")


# What a kernel is tuned for: sizes, dtypes, how many boxes images hold and the reduction; its key
# "B1024-S256-bfloat16-uint8-article-mean"
Problem = problem_class(OP_DECLARATION, FAMILY, {"batch": 1024, "slots": 256, "pred": "bfloat16", "target": "uint8"},
                        {"batch": "images per batch, B", "slots": "box slots per image, S",
                         "reduction": "the loss's reduction"}, scalars=("reduction",),
                        fields={"distribution": option("article", "boxes per image: article = floor(|N(0,3)|) clipped "
                                                       "to the slots, uniform, full", flag="--boxes",
                                                       choices=DISTRIBUTIONS)})


def box_counts(batch: int, slots: int, distribution: str, generator):
    """Boxes per image: the article's floor(|N(0, 3)|) clipped to the slots, uniform, or full."""
    import torch

    device = generator.device
    if distribution == "article":
        n = torch.randn(batch, generator=generator, device=device).mul_(3).abs_().floor_()
        return n.clamp_(0, slots).to(torch.int64)
    if distribution == "uniform":
        return torch.randint(0, slots + 1, (batch,), generator=generator, device=device)
    if distribution == "full":
        return torch.full((batch,), slots, dtype=torch.int64, device=device)
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")


def make_inputs(batch: int, slots: int, pred: str = "bfloat16", target: str = "uint8",
                distribution: str = "article", device="cpu", seed: int | None = None, counts=None, **_scalars):
    """Fresh random (pred, target, num_boxes) in the article's 256x256 image frame.

    Targets are the article's boxes (integer corners in [0, 255], sides >= 1) and
    zero at padding, so both validity conventions agree; preds are the targets
    moved and resized by noise (overlapping or not), with random values at
    padding, since a model writes something there too. Generated where they are used
    (on a GPU: no host work, no copy); a seed gives the same inputs on the same device.
    """
    import torch

    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed if seed is not None else torch.seed() % 2**63)
    on = dict(generator=g, device=device)
    counts = box_counts(batch, slots, distribution, g) if counts is None else counts.to(device, torch.int64)
    valid = torch.arange(slots, device=device)[None, :] < counts[:, None]
    size = torch.randint(1, 256, (batch, slots, 2), **on).float()
    top_left = torch.randint(0, 255, (batch, slots, 2), **on).float()
    bottom_right = (top_left + size).clamp(0, 255)
    if dtype_name(target) != "uint8":  # float targets need not sit on the pixel grid; sides stay > 0
        top_left = top_left + torch.rand(batch, slots, 2, **on) * 0.5
        bottom_right = bottom_right - torch.rand(batch, slots, 2, **on) * 0.4
    tgt = torch.cat([top_left, bottom_right], -1)
    tgt = torch.where(valid[..., None], tgt, torch.zeros((), device=device))

    centre = (tgt[..., :2] + tgt[..., 2:]) / 2 + torch.randn(batch, slots, 2, **on) * 30
    half = (tgt[..., 2:] - tgt[..., :2]).clamp(min=1) / 2 * torch.exp(torch.randn(batch, slots, 2, **on) * 0.5)
    prd = torch.cat([centre - half, centre + half], -1)
    noise = torch.rand(batch, slots, 4, **on) * 256
    prd = torch.where(valid[..., None], prd, noise)

    pred_t = prd.to(_torch_dtype(pred))
    target_t = tgt.round().to(torch.uint8) if dtype_name(target) == "uint8" else tgt.to(_torch_dtype(target))
    return pred_t, target_t, counts


def _torch_dtype(name: str):
    import torch

    return getattr(torch, dtype_name(name))


# ------------------------------------------------------------ verification

# Relative error ||got - want|| / ||want|| allowed beyond rounding to the output's dtype (the
# loss: float32 math on exactly the reference's inputs; the gradient: pred's dtype). The search
# checks every variant at the problem's sizes and at ODD_SIZES (tuner/measure/declared.py).
TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1e-2}
LOSS_TOL, GRAD_TOL = TOLERANCE["float32"], TOLERANCE
ODD_SIZES = ({"batch": 3, "slots": 7},)  # a block ends mid-image, mid-vector


from tuner.measure.accuracy import check  # noqa: E402,F401  (tests use it from here)


# ------------------------------------------------------------------ bench

# `tuner bench --family giou` (tuner/report/declared.py): the article's batch sizes and two dtype
# pairs, every row also timed with the op's other two ways of reporting bad input and inside
# torch.compile's CUDA graphs; GPU time from the profiler (the article's loop reads its counts).
BENCH_SHAPES = ((64, 256), (256, 256), (1024, 256), (4096, 256))
BENCH_DTYPES = (("bfloat16", "uint8"), ("float32", "float32"))
BENCH_VALIDATE = ("sync", "deferred")
BENCH_REDUCE_OVERHEAD = True
BENCH_GRAPHS = False
BENCH_HOST_FLOORS = True  # a launch, autograd and F.mse_loss (a native op) alone beside the rows
LOOP_MAX_BATCH = 1024  # the article's per-sample loop takes seconds a call beyond this: left out there


def bench_rows(problem: dict, inputs) -> dict:
    """What the article's users run (1 - GIoU in float32 math on upcast targets: its own loss is
    the mean GIoU on uint8 targets, which overflows): its per-sample loop, its concatenation of
    the valid boxes and torchvision's loss masked (its single CUDA kernel: BENCH_VARIANTS). The
    targets' list and mask are made once, as a data loader hands them over."""
    import torch

    pred, target, counts = inputs[:3]
    targets = [target[i, :int(c)] for i, c in enumerate(counts.tolist())]
    mask = torch.arange(target.shape[1], device=target.device)[None, :] < counts[:, None]

    def one_minus_giou(p, t):
        return giou_loss_elementwise(p.float(), t.float(), DEFAULT_EPS)

    def loop(p, *_):
        total, count = 0.0, 0
        for i, t in enumerate(targets):
            if t.shape[0]:
                total, count = total + one_minus_giou(p[i, :t.shape[0]], t).sum(), count + t.shape[0]
        return total / max(count, 1)

    def torchvision(p, t, n, *_):
        from torchvision.ops import generalized_box_iou_loss

        loss = generalized_box_iou_loss(p.float(), t.float(), reduction="none", eps=DEFAULT_EPS)
        return torch.where(mask, loss, 0).sum() / mask.sum().clamp(min=1)

    rows = {"article loop": loop} if problem["batch"] <= LOOP_MAX_BATCH else {}
    rows["article concat"] = lambda p, *_: one_minus_giou(p[mask], torch.cat(targets)).mean()
    if importlib.util.find_spec("torchvision") is not None:
        rows["torchvision + mask"] = torchvision
    else:
        print("torchvision is not installed: its row is left out", flush=True)
    return rows


# The article's single CUDA kernel, a row beside those (tuner.report.declared.variant_rows): one thread
# per slot, float32 math, the per-box losses summed by torch ops.
BENCH_VARIANTS = {"simple CUDA kernel": (
    {"boxes_per_thread": 1, "padding": "branch", "validation": "none", "block_size": 256, "loads": "scalar",
     "reduction": "atomic", "backward": "recompute"},
    {"reduction": "none"}, lambda loss, p, t, n, *_: loss.sum() / n.clamp(0, p.shape[1]).sum().clamp(min=1))}
