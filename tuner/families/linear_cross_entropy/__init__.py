"""Linear cross-entropy: F.cross_entropy(hidden @ weight.T, target), an LM head and its loss as one op
(hidden [tokens, H], weight [vocab, H]: float32, float16 or bfloat16), its GEMMs on cuBLAS a chunk of
tokens at a time (docs/families.md). Tuned: the chunk's rows, the cross-entropy kernels' threads,
loads and L2 hints."""

from __future__ import annotations

from tuner.families.linear_cross_entropy.op import OP_DECLARATION  # noqa: F401 (the op: its C++ and C ABI are rendered from it)
from tuner.families.linear_cross_entropy.spec import DTYPES, REDUCTIONS, reference  # noqa: F401
from tuner.space import Constraint, Dim, Space, dtype_name, fixed_spaces, itemsize, option, problem_class

FAMILY = "linear_cross_entropy"
# checked beside the problem's: a vocabulary no vector divides over chunks, one class, every target ignored
ODD_SIZES = ({"tokens": 300, "width": 72, "vocab": 1001}, {"tokens": 3, "width": 8, "vocab": 1},
             {"tokens": 5, "width": 16, "vocab": 300, "ignored": 1.0})
SEARCH_TRIALS = 24  # `tuner search`'s default: a call takes ~24 ms at the default problem (70 s on an H200)
CHECK_SIZES = {"tokens": 2048}  # a search's checks: several chunks still (the finalists: the problem's own)
# the gradients: of logits rounded to hidden's dtype, and of their gradient rounded again (float16's
# softmax of a 128256-word vocabulary is subnormal)
TOLERANCE = {"float16": 1e-2, "bfloat16": 1.5e-2, "float32": 2e-5}
TOLERANCE_OF = {"loss": "hidden"}  # the float32 loss of logits rounded to hidden's dtype
DIMS = (
    Dim("chunk_rows", (128, 256, 512, 1024, 2048), "tokens a chunk at most (at most 1/8 of them, or 64 MiB of "
        "logits, the larger)"),
    Dim("threads_per_row", (128, 256, 512, 1024), "threads of the cross-entropy kernel a row (a block each)"),
    Dim("vec", (1, 2, 4, 8), "elements per load"),
    Dim("first_read", ("normal", "evict_last"), "the L2 priority of the kernel's first read of a row it reads again"),
    Dim("reread", ("in_order", "reverse"), "the second read of a row in order, or from its end back"),
)


def space(hidden: str = "bfloat16") -> Space:
    """The variants for one dtype (the problem's, not tuned)."""
    hidden = dtype_name(hidden, DTYPES, "hidden")
    constraints = (Constraint("a load is at most 16 bytes", lambda p: p["vec"] * itemsize(hidden) <= 16),)
    return Space(FAMILY, {"hidden": hidden}, DIMS, constraints)


space_for, all_spaces, covering_set = fixed_spaces(space, hidden=DTYPES)

# tokens, width (H), vocab, hidden (its dtype), reduction, label_smoothing; Llama 3 8B's head by default
Problem = problem_class(OP_DECLARATION, FAMILY, {"tokens": 4096, "width": 4096, "vocab": 128256, "hidden": "bfloat16"},
                        {"tokens": "tokens of the batch (rows of hidden)", "width": "the hidden size, H",
                         "vocab": "the vocabulary (rows of the weight)"},
                        scalars=("reduction", "label_smoothing"),
                        fields={"label_smoothing": option(0.0, "label smoothing, from 0 to 1", parse="fraction")})


def make_inputs(tokens: int, width: int, vocab: int, hidden: str = "bfloat16", ignored: float = 1 / 7,
                device="cuda", seed: int = 0, **_scalars):
    """Hidden states, a head's weight that spreads logits as a trained model's (std ~3), targets (`ignored` -100)."""
    import torch

    dtype = getattr(torch, dtype_name(hidden))
    g = torch.Generator(device=device).manual_seed(seed)
    h = torch.randn(tokens, width, generator=g, device=device).to(dtype)
    w = (torch.randn(vocab, width, generator=g, device=device) * (3 / max(width, 1) ** 0.5)).to(dtype)
    target = torch.randint(0, vocab, (tokens,), generator=g, device=device)
    target[torch.rand(tokens, generator=g, device=device) < ignored] = -100
    return h, w, target


BENCH_SHAPES = ((4096, 4096, 128256), (8192, 4096, 128256), (16384, 4096, 128256), (4096, 2048, 32000),
                (4096, 3584, 151936))  # tokens x H x vocab: Llama 3 8B's head, Llama-2-style and Qwen2's
BENCH_GRAPHS = False  # Liger's backward syncs: GPU times are the profiler's sum of kernels


def bench_floors(problem: dict, inputs) -> dict:
    """The three GEMMs alone (the logits, both gradients'; cuBLAS, the inputs' dtype): no chunking beats it."""
    import torch

    h, w = inputs[0], inputs[1]
    logits = torch.mm(h, w.T)
    return {"floor: the three GEMMs": (lambda: torch.mm(h, w.T),
                                       lambda: (torch.mm(h, w.T), torch.mm(logits, w), torch.mm(logits.T, h)))}


def anchors() -> dict:
    """Beside torch's op in `tuner bench` (`pip install 'tuner[bench]'`): Liger's and Apple's (it needs triton)."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    found = {"Liger": lambda h, w, t, ignore_index=-100, label_smoothing=0.0, reduction="mean":
             LigerFusedLinearCrossEntropyFunction.apply(h, w, t, None, None, ignore_index, 0.0, label_smoothing,
                                                        reduction)[0]}
    try:
        from cut_cross_entropy import linear_cross_entropy as cut
    except ImportError:
        return found

    def cut_ce(h, w, t, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
        if label_smoothing:
            raise ValueError("Cut Cross-Entropy has no label smoothing")
        return cut(h, w, t, ignore_index=ignore_index, reduction=reduction)
    return {**found, "Cut Cross-Entropy": cut_ce}
