"""A tiny kernel family defined outside tuner: out = alpha * x + y on float32 vectors.

It exists to hold the boundary between tuner's core and its families: tests/test_family_plugin.py
takes it through `variants`, `build`, a simulated search, `export-best` and `tuner.load` with no
edit to tuner itself. Everything a family gives core is here and in op.py: its command line (the
problem's options, `describe`, `bench`) is the one its declaration gives (tuner.cli.target).
"""

from __future__ import annotations

from pathlib import Path

from tuner.space import Constraint, Dim, Space, fixed_spaces, problem_class

FAMILY = "scale_add"
TEMPLATES = Path(__file__).parent / "templates"
# By convention (tuner.families.conventions): its kernel template scale_add.cu.j2 in TEMPLATES. Its op is
# declared (op.py): the core renders the op's C++ and the C ABI header scale_add_abi.h from it.
from .op import OP_DECLARATION, reference  # noqa: E402,F401

DIMS = (
    Dim("block_size", (64, 128, 256), "threads per block"),
    Dim("items", (1, 2, 4), "elements per thread"),
)
CONSTRAINTS = (Constraint("at most 512 elements per block", lambda p: p["block_size"] * p["items"] <= 512),)


# n and alpha, the op's scalar, where a search checks and times it; keyed by n alone ("N1048576"):
# alpha changes no timing
Problem = problem_class(OP_DECLARATION, FAMILY, {"n": 1 << 20, "alpha": -1.5}, {"n": "vector length"},
                        scalars=("alpha",), key=lambda problem: f"N{problem.n}")


def space(_problem: dict | None = None) -> Space:
    return Space(FAMILY, {}, DIMS, CONSTRAINTS)


space_for, all_spaces, covering_set = fixed_spaces(space)  # one space: nothing picks it


def make_inputs(n: int, alpha: float = -1.5, device="cuda", seed: int = 0):
    """x and y of a problem, random (a search checks and times variants on them)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(n, generator=g, device=device), torch.randn(n, generator=g, device=device)
