"""The cross-entropy family: F.cross_entropy(logits, target) over logits [rows, vocab] (float32,
float16 or bfloat16) with ignore_index, label_smoothing and reduction none/mean/sum; the loss in
float32, the gradient of the logits in their dtype. Tuned: threads per row, rows per block, the
vector width of the loads, who writes the gradient, and the cache hints of a row the forward reads
twice."""

from __future__ import annotations

from tuner.families.cross_entropy.op import OP_DECLARATION  # noqa: F401 (the op: its C++ and C ABI are rendered from it)
from tuner.families.cross_entropy.spec import DTYPES, REDUCTIONS, reference  # noqa: F401
from tuner.space import Constraint, Dim, Space, dtype_name, fixed_spaces, itemsize, option, problem_class

FAMILY = "cross_entropy"
# checked beside the problem's: a vocabulary no vector divides, a row of one class, every target ignored
ODD_SIZES = ({"rows": 7, "vocab": 1001}, {"rows": 3, "vocab": 1}, {"rows": 5, "vocab": 300, "ignored": 1.0})
DIMS = (
    Dim("threads_per_row", (32, 64, 128, 256, 512, 1024), "threads per row: a warp, several warps, a block"),
    Dim("block_size", (128, 256, 512, 1024), "threads per block (rows per block: block / threads per row)"),
    Dim("vec", (1, 2, 4, 8), "elements per load"),
    Dim("gradient", ("backward", "forward"),
        "the gradient written by the backward (the logits read again), or by the forward (a row read again at once, "
        "from L2) for an output gradient of 1, which the backward scales where it is not 1 (a mean's or sum's; "
        "reduction none's gradient is written by the backward unless in place)"),
    Dim("first_read", ("normal", "evict_last"), "the L2 priority of the forward's first read of a row it reads again"),
    Dim("reread", ("in_order", "reverse"), "the forward's second read of a row in order, or from its end back (the "
        "last lines read are the likeliest still in L2)"),
)


def space(logits: str = "bfloat16") -> Space:
    """The variants for one logits dtype (the problem's, not tuned)."""
    logits = dtype_name(logits, DTYPES, "logits")
    constraints = (
        Constraint("a row's threads fit in a block", lambda p: p["threads_per_row"] <= p["block_size"]),
        Constraint("a load is at most 16 bytes", lambda p: p["vec"] * itemsize(logits) <= 16),
        Constraint("a first read's priority and the second read's order are for a row read again in the forward",
                   lambda p: p["gradient"] == "forward" or (p["first_read"], p["reread"]) == ("normal", "in_order")),
    )
    return Space(FAMILY, {"logits": logits}, DIMS, constraints)


space_for, all_spaces, covering_set = fixed_spaces(space, logits=DTYPES)
# `tuner search --dtypes training`: bfloat16 logits, and float32 ones of models that upcast before the loss
TRAINING_DTYPES = (("bfloat16",), ("float32",))


def search_focus(problem: dict) -> dict[str, int]:
    """What a search of `problem` renders: the kernels its vocabulary runs (one vector width and
    tail, the variant's one backward: 3 kernels of 10). Its check then covers that vocabulary only,
    so the finalists are built whole and checked at the odd sizes too before one wins
    (`FINALISTS_WHOLE`, tuner.search.finalists); exports build every kernel. Reduction none's
    backward writes the gradient in every variant (`only_none`: the one backward it runs)."""
    return {"only_vocab": int(problem["vocab"]), "only_none": int(problem.get("reduction", "mean") == "none")}


FINALISTS_WHOLE = True
FOCUS_RUNS_ODD_SIZES = False  # a search's build runs its problem's vocabulary only (tuner/measure/declared.py)

# rows, vocab, logits (its dtype), reduction, label_smoothing; its key "R4096-V32000-bfloat16-mean-ls0"
Problem = problem_class(OP_DECLARATION, FAMILY, {"rows": 4096, "vocab": 32000, "logits": "bfloat16"},
                        {"rows": "rows: tokens of the batch", "vocab": "the vocabulary (classes)"},
                        scalars=("reduction", "label_smoothing"),
                        fields={"label_smoothing": option(0.0, "label smoothing, from 0 to 1", parse="fraction")})


def make_inputs(rows: int, vocab: int, logits: str = "bfloat16", ignored: float = 1 / 7, device="cuda", seed: int = 0,
                **_scalars):
    """Logits (normal, scaled as a trained model's) and targets, `ignored` of them -100."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=g, device=device) * 4).to(getattr(torch, dtype_name(logits)))
    target = torch.randint(0, vocab, (rows,), generator=g, device=device)
    target[torch.rand(rows, generator=g, device=device) < ignored] = -100
    return x, target


def floor_bytes(problem: dict, inputs=None) -> tuple[int, int]:
    """A forward reads the logits; a fused forward+backward reads them once and writes their gradient."""
    once = problem["rows"] * problem["vocab"] * itemsize(problem["logits"])
    return once, 2 * once


BENCH_SHAPES = ((4096, 32000), (4096, 128256), (16384, 32000), (16384, 128256))  # rows x vocab
BENCH_GRAPHS = False  # Liger's backward syncs (torch.equal): GPU times are the profiler's sum of kernels
PROBLEMS_GRAPHS = True  # `--problems` and the export's check time the op and torch's alone: from graphs


def anchors() -> dict:
    """Beside torch's op in `tuner bench`: Liger's kernel (`pip install 'tuner[bench]'`)."""
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    def liger(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean", in_place=False):
        return LigerCrossEntropyFunction.apply(logits, target, None, ignore_index, 0.0, label_smoothing, reduction)[0]

    return {"Liger": liger}


def tuned_rows() -> dict:
    """More rows of the tuned op in `tuner bench`: its gradient written over the logits, as Liger's is."""
    import torch

    return {"in place": lambda *args: torch.ops.tuner.cross_entropy(*args[:5], True)}
