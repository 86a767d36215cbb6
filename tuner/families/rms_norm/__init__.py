"""The RMSNorm family: torch.nn.functional.rms_norm over the last dimension, tuned.

y = x / sqrt(mean(x^2) + eps) * weight for x [..., width] and weight [width], x and weight
each float32, float16 or bfloat16; y has x's dtype; math in float32. The backward gives the
gradients of x and of weight. Tuned: how a row maps to threads, the loads, what stays in
registers, whether the backward reads 1/rms saved by the forward, how the weight's gradient
is reduced (float atomics, or deterministic per-block partials).
"""

from __future__ import annotations

from tuner.families.rms_norm.op import OP_DECLARATION  # noqa: F401 (the op: its C++ and C ABI are rendered from it)
from tuner.families.rms_norm.spec import DEFAULT_EPS, DTYPES, reference  # noqa: F401
from tuner.space import Constraint, Dim, Space, dtype_name, fixed_spaces, itemsize, problem_class

FAMILY = "rms_norm"  # its kernel template by convention: templates/rms_norm/rms_norm.cu.j2
ODD_SIZES = ({"rows": 1, "width": 1027}, {"rows": 37, "width": 771})  # checked beside the problem's: no vector
# divides the widths; the rows do not fill a block

DIMS = (
    Dim("threads_per_row", (32, 64, 128, 256, 512, 1024), "threads per row: a warp, several warps, a block"),
    Dim("block_size", (128, 256, 512, 1024), "threads per block (rows per block: block / threads per row)"),
    Dim("vec", (1, 2, 4, 8), "elements per load"),
    Dim("unroll", (1, 2, 4), "loads per thread kept in registers between a row's two passes"),
    Dim("rstd", ("recompute", "saved"), "backward: 1/rms recomputed from x, or read as the forward saved it"),
    Dim("grad_weight", ("atomic", "partials"),
        "weight gradient: per-block sums added with float atomics, or per-block partial rows summed by a "
        "second kernel (deterministic)"),
    Dim("bwd_blocks", (1, 2, 4, 8), "backward blocks resident per SM (each sums the weight gradient of its rows)"),
    Dim("walk", ("blocks", "resident"),
        "rows that fit in registers: one row group per block, or resident blocks striding over rows that keep "
        "the weight in registers and load the next row while writing this one"),
)


def space(x: str = "bfloat16", weight: str = "bfloat16") -> Space:
    """The variants for one (x, weight) dtype pair; the dtypes are the problem, not tuned."""
    x, weight = dtype_name(x, DTYPES, "x"), dtype_name(weight, DTYPES, "weight")
    widest = max(itemsize(x), itemsize(weight))
    constraints = (
        Constraint("a row's threads fit in a block", lambda p: p["threads_per_row"] <= p["block_size"]),
        Constraint("a load is at most 16 bytes (vec * element size <= 16)", lambda p: p["vec"] * widest <= 16),
        Constraint("at most 16 elements a thread kept in registers (vec * unroll <= 16)",
                   lambda p: p["vec"] * p["unroll"] <= 16),
        Constraint("at most 2048 backward threads an SM", lambda p: p["bwd_blocks"] * p["block_size"] <= 2048),
    )
    return Space(FAMILY, {"x": x, "weight": weight}, DIMS, constraints)


space_for, all_spaces, covering_set = fixed_spaces(space, x=DTYPES, weight=DTYPES)


# rows, width, x, weight (their dtypes); its key "R4096-W4096-bfloat16-bfloat16"
Problem = problem_class(OP_DECLARATION, FAMILY,
                        {"rows": 4096, "width": 4096, "x": "bfloat16", "weight": "bfloat16"},
                        {"rows": "rows: x's leading dimensions multiplied",
                         "width": "the normalized (last) dimension"})


def make_inputs(rows: int, width: int, x: str = "bfloat16", weight: str = "bfloat16", device="cuda",
                seed: int = 0):
    """Random x (normal, rows of different scales) and weight (near 1, as trained norms are)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    xs = torch.randn(rows, width, generator=g, device=device) * (torch.rand(rows, 1, generator=g, device=device) * 4 + 0.1)
    w = 1 + 0.2 * torch.randn(width, generator=g, device=device)
    return xs.to(getattr(torch, dtype_name(x))), w.to(getattr(torch, dtype_name(weight)))


def search_focus(problem: dict) -> dict[str, int]:
    """What a search of `problem` renders: the kernels its width runs (the vector width that divides
    it, one of the two row walks: 3 kernels of 9). Its check then covers that width only, so the
    finalists are built whole and checked at the odd sizes too before one wins (`FINALISTS_WHOLE`,
    tuner.search.finalists); exports build every kernel."""
    return {"only_width": int(problem["width"])}


FINALISTS_WHOLE = True
FOCUS_RUNS_ODD_SIZES = False  # a search's build runs its problem's width only (tuner/measure/declared.py)

BENCH_SHAPES = ((4096, 4096), (8192, 8192), (16384, 4096))  # rows x width, `tuner bench`'s default
# `tuner search --dtypes training`: mixed precision keeps a norm's weight in float32 beside 16-bit
# activations, a pair torch does not fuse (its unfused path ~10x a variant's)
TRAINING_DTYPES = (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float32"))


def anchors() -> dict:
    """Beside torch's op in `tuner bench`: Liger's Triton kernel (`pip install 'tuner[bench]'`)."""
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return {"Liger": lambda x, w, eps: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)}

