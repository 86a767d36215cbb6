"""A family outside tuner with EmbeddingBag's declared parts (tests/test_family_plugin.py runs it on
the GPU): bags of rows of a table, summed or their largest taken, each entry scaled by an
optional per-entry weight that takes a gradient, a row left out where it is `padding_idx`
(negative: from the end); max mode saves which entry won for the backward; both passes take
memory their variant sizes from the call; a backward may read the entries sorted by row."""

from __future__ import annotations

from pathlib import Path

from tuner.space import Dim, Space, fixed_spaces, problem_class

FAMILY = "bags_sum"
TEMPLATES = Path(__file__).parent / "templates"
from .op import OP_DECLARATION, reference  # noqa: E402,F401

DIMS = (Dim("block_size", (64, 128), "threads per block"),
        Dim("backward", ("atomic", "sorted"), "the table's gradient: atomics, or each row's entries summed in order"))

Problem = problem_class(OP_DECLARATION, FAMILY, {"bags": 512, "per": 7, "dim": 64, "rows": 1000, "mode": "max"},
                        scalars=("mode",))


def space(_problem: dict | None = None) -> Space:
    return Space(FAMILY, {}, DIMS, ())


space_for, all_spaces, covering_set = fixed_spaces(space)


def make_inputs(bags: int, per: int, dim: int, rows: int, mode: str = "max", device="cuda", seed: int = 0):
    """indices, per-entry weights (given, so that their gradient is checked too), the table."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randint(0, rows, (bags, per), generator=g, device=device),
            torch.rand(bags, per, generator=g, device=device) + 0.5,
            torch.randn(rows, dim, generator=g, device=device))
