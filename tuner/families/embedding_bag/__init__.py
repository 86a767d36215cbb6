"""The EmbeddingBag family: torch.nn.functional.embedding_bag, tuned.

The op: `weight` [num_rows, dim]; `indices` 1-D with `offsets` (bag b is
indices[offsets[b]:offsets[b+1]], the last bag runs to the end unless
`include_last_offset`), or 2-D [bags, n] without; modes sum, mean, max;
`per_sample_weights` (sum only) scale each row; entries equal to `padding_idx`
are left out (and not counted by mean). Empty bags give zeros. Math is float32
whatever the weight dtype; the output has the weight's dtype.

What is tuned follows PyTorch PR 167834, which made the forward 1.3-2.1x faster by
moving the bounds check of each index out of the gather loop: where validation sits,
how bags map to threads, whether long bags are cut into chunks spread over the GPU, how wide
the loads are, how many rows are in flight.
"""

from __future__ import annotations

from tuner.space import (Constraint, Dim, Space, fixed_spaces, dtype_name, itemsize, kernel_arg, option,  # noqa: F401
                         problem_class)

FAMILY = "embedding_bag"  # its files by convention (tuner.families.conventions): embedding_bag.cu.j2, ...

from tuner.families.embedding_bag.op import OP_DECLARATION  # noqa: F401 (the op: its C++ and C ABI are rendered from it)
from tuner.families.embedding_bag.spec import INDEX_DTYPES, MODES, WEIGHT_DTYPES, reference  # noqa: F401
DISTRIBUTIONS = ("random", "one_hot", "multi_hot")  # the PR's three index distributions

DIMS = (
    Dim("validation", ("none", "inline", "hoisted", "kernel"),
        "indices out of range: clamped only / checked in the gather loop / checked in a loop before "
        "it (no early exit, as the PR) / checked by a separate kernel first"),
    Dim("mapping", ("warp", "subwarp", "block"),
        "threads per bag: a warp, 8 lanes, or a whole block (with more lanes than a row needs, as slices that "
        "gather contiguous parts of the bag's entries, added in slice order)"),
    Dim("split", (None, 32, 64),
        "bags whole, one per group; or cut into chunks of 32 or 64 entries, each gathered by a group of its "
        "own (spread over the GPU, so that the longest bags do not set the time), the chunks' partials added "
        "in chunk order (deterministic) by the group that finishes its bag last"),
    Dim("order", (None, "longest"),
        "bags gathered in their order, or the longest first: the grid passes over the bags once per length "
        "class and each pass keeps one class, longest first, so the longest bags are not left for the end of "
        "the wave (one kernel, nothing sorted)"),
    Dim("vec", (1, 2, 4, 8), "feature elements per load"),
    Dim("unroll", (1, 2, 4, 8), "rows in flight per thread (unroll of the index loop)"),
    Dim("block_size", (64, 128, 256, 512), "threads per block"),
    Dim("staging", ("direct", "shared"),
        "indices: each read where its row is gathered, or a group's worth loaded into shared memory first"),
    Dim("backward", ("atomic", "sorted"),
        "gradient of weight: float atomics per gathered row, or a sorted, deterministic segment reduction"),
)


def _constraints(weight: str) -> tuple[Constraint, ...]:
    return (
        Constraint("a load is at most 16 bytes (vec * element size <= 16)",
                   lambda p: p["vec"] * itemsize(weight) <= 16),
        Constraint("a block-per-bag mapping needs no more than 256 threads to cover a row",
                   lambda p: p["mapping"] != "block" or p["block_size"] <= 256),
        Constraint("chunks of a bag go to warps or subwarps (a block per bag already splits its bag over its warps)",
                   lambda p: p["split"] is None or p["mapping"] != "block"),
        Constraint("longest first orders whole bags (chunks of split bags are spread over the GPU already)",
                   lambda p: p["order"] is None or p["split"] is None),
        Constraint("atomic scatter-add is for float32 weights: 16-bit atomics lose the sum of a frequent id",
                   lambda p: p["backward"] != "atomic" or weight == "float32"),
    )




def space(weight: str = "float32", index: str = "int64") -> Space:
    """The variants for one (weight, index) dtype pair; the dtypes are the problem, not tuned."""
    weight, index = dtype_name(weight, WEIGHT_DTYPES, "weight"), dtype_name(index, INDEX_DTYPES, "index")
    return Space(FAMILY, {"weight": weight, "index": index}, DIMS, _constraints(weight))


space_for, all_spaces, covering_set = fixed_spaces(space, weight=WEIGHT_DTYPES, index=INDEX_DTYPES)
# A search renders the forward of its problem's mode only (two fifths less to compile); its check then
# covers that mode, so the finalists are built whole and checked in every mode before one wins
# (`FINALISTS_WHOLE`, tuner.search.finalists); exports build all three.
KERNEL_ARGS, search_focus = kernel_arg(OP_DECLARATION, "mode")
FINALISTS_WHOLE = True
# A forward and a backward of different variants in one table (tuner.build.render, Variant.joined): the
# search's finalists may join the best forward to the best backward (tuner.search.finalists).
JOINED_TEMPLATE = "embedding_bag_joined.cu.j2"


# What a kernel is tuned for (defaults: the PR's configuration); its key
# "R5000000-D128-B2048-L150-sum-float32-int64-random"
Problem = problem_class(
    OP_DECLARATION, FAMILY, {"rows": 5_000_000, "dim": 128, "bags": 2048, "bag_size": 150, "mode": "sum",
                             "weight": "float32", "index": "int64"},
    {"rows": "embedding rows (the PR's)", "dim": "embedding dim", "bags": "bags", "mode": "how a bag's rows combine",
     "index": "index dtype"},
    scalars=("mode",), sizes=("rows", "dim", "bags", "bag_size"), dtype_fields={"indices": "index"},
    fields={"bag_size": option(150, "mean indices per bag", parse="size_or_zero"),
            "distribution": option("random", "index distribution: random, one_hot, multi_hot", flag="--ids",
                                   choices=DISTRIBUTIONS)},
    key=lambda p: f"R{p.rows}-D{p.dim}-B{p.bags}-L{p.bag_size}-{p.mode}-{p.weight}-{p.index}-{p.distribution}")
# What `tuner search --family embedding_bag` tunes when the command names no problem (tuner.cli.problems),
# a study each, with its share of --trials (the PR's problem all of them, as before it had a second: its
# winner is the PR's number): the PR's long bags, and many short bags of narrow rows as
# recommendation models' tables have them. A variant tuned at the PR's bags alone took 1.4-1.7x the GPU
# time of torch's op (behind its guard) forward at 1M x 32, 8,192 and 32,768 bags of 9, so torch's op
# served there, its guard costing more than 2%; one tuned at them ran 0.4-0.7x F.embedding_bag's
# forward GPU time from 2,048 to 32,768 bags of 9 and 20 (H100, docs/benchmarks.md).
DEFAULT_PROBLEMS = (({}, 1.0), ({"rows": 1_000_000, "dim": 32, "bags": 8192, "bag_size": 9}, 1 / 3))


# A row's gradient is a float32 sum of a term per entry naming it, rounded about sqrt(hits) * eps: a
# one-hot id (half the PR's 300,000 entries) is allowed 16 times that, 4e-4; the rest are the core's.
TOLERANCE = {"float32": 4e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
# Checked beside the problem: entries equal to padding_idx (-1: the last row), which count nowhere.
ODD_SIZES = ({"padding_idx": -1},)
# A search checks each variant on a table of at most this many rows (its bags, their lengths and the
# index distribution the problem's): rows set the table's memory, not how the kernels run. The
# finalists are checked on the problem's own table (tuner.measure.cases.sized).
CHECK_SIZES = {"rows": 1 << 16}


def captured(problem: dict) -> dict | None:
    """A recorded call's problem (tuner.capture): bags of under one entry on average tuned as bags of
    one (its key's mean, n // bags, is 0 there, and make_inputs would draw no entry at all); a call
    with no bag is none."""
    return {**problem, "bag_size": max(1, problem["bag_size"])} if problem["bags"] else None


# ---------------------------------------------------------------------- inputs

def make_inputs(rows: int, dim: int, bags: int, bag_size: int, mode: str = "sum", weight: str = "float32",
                index: str = "int64", distribution: str = "random", seed: int = 0, device="cpu",
                per_sample_weights: bool | None = None, padding_idx: int | None = None):
    """(weight, indices, offsets, per_sample_weights or None) for a problem's fields: bag sizes
    uniform in [0, 2 * bag_size] (some empty), ids drawn as the distribution says: `random` uniform
    over the rows, `one_hot` half of them one id, `multi_hot` half of them among 8 ids; every
    seventh id is padding_idx where one is given. Per-sample weights where asked, or (None) in sum
    mode. Drawn where they are used (a 5M-row table took seconds on the host and its copy more); a
    seed gives the same inputs on the same device."""
    import torch

    if distribution not in DISTRIBUTIONS:  # each other name drew multi-hot ids
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    on = dict(generator=g, device=device)
    dtype = getattr(torch, weight)
    table = torch.randn(rows, dim, **on).to(dtype)
    sizes = torch.randint(0, 2 * bag_size + 1, (bags,), **on)
    n = int(sizes.sum())
    ids = torch.randint(0, rows, (n,), **on)
    if distribution != "random":
        hot = torch.rand(n, **on) < 0.5
        few = torch.randint(0, rows, (1 if distribution == "one_hot" else 8,), **on)
        ids = torch.where(hot, few[torch.randint(0, few.numel(), (n,), **on)], ids)
    if padding_idx is not None:
        ids[::7] = padding_idx % rows
    offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
    ints = getattr(torch, index)
    psw = torch.rand(n, **on).to(dtype) + 0.5 if (mode == "sum" if per_sample_weights is None
                                                   else per_sample_weights) else None
    return table, ids.to(ints), offsets.to(ints), psw


# ------------------------------------------------------------------ bench

# `tuner bench --family embedding_bag` (tuner/report/declared.py): the PR's configuration in every
# mode and index distribution, smaller bags, its wide-row shape and 16-bit weights, no per-sample
# weights (the PR's calls have none). GPU time from the profiler: torch's dense backward synchronized
# inside its sort-and-unique in older releases, which a CUDA graph cannot capture (pytorch#93807).
BENCH_PROBLEMS = tuple({**p, "per_sample_weights": False} for p in (
    *({"mode": m} for m in MODES), *({"distribution": d} for d in ("one_hot", "multi_hot")),
    *({"bag_size": n} for n in (20, 10)), {"rows": 128_000, "dim": 4096},
    *({"weight": w} for w in ("float16", "bfloat16"))))
BENCH_GRAPHS = False
BENCH_COMPILED = False  # no torch.compile row (none was in this bench; each problem would compile apart)
BENCH_READ_FLOOR = True  # beside the floor at HBM's rate: a streaming read of the gathered bytes, measured


def floor_bytes(problem: dict, inputs) -> tuple[int, None]:
    """The gathered rows (ids x dim x element size), moved once: the forward's floor."""
    weight, indices = inputs[0], inputs[1]
    return indices.numel() * weight.shape[1] * weight.element_size(), None
