"""A tiny kernel family defined outside tuner: out = alpha * x + y on float32 vectors.

It exists to hold the boundary between tuner's core and its families: tests/test_family_plugin.py
takes it through `variants`, `build`, a simulated search, `export-best` and `tuner.load` with no
edit to tuner itself. Everything a family gives core is here and in cli.py and op.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tuner import declare
from tuner.space import Constraint, Dim, Space, fixed_spaces
from tuner.variant import Variant

FAMILY = "scale_add"
TEMPLATES = Path(__file__).parent / "templates"
# By convention (tuner.families.conventions): its kernel template scale_add.cu.j2 and its C ABI
# scale_add_abi.h (the variants' table, tuner_scale_add_vtable), in TEMPLATES. Its op is declared:
# the core renders the op's C++ and the ABI header from this (tuner/build/declared.py).
OP_DECLARATION = declare.Op(
    "scale_add",
    inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("y", like="x"), declare.Scalar("alpha")),
    outputs=(declare.Tensor("out", like="x"),),
    sizes={"n": "x.numel()"},
    baseline="x * alpha + y",  # torch's, for calls outside float32 and those no variant beat
)

DIMS = (
    Dim("block_size", (64, 128, 256), "threads per block"),
    Dim("items", (1, 2, 4), "elements per thread"),
)
CONSTRAINTS = (Constraint("at most 512 elements per block", lambda p: p["block_size"] * p["items"] <= 512),)


@dataclass(frozen=True)
class Problem:
    family: ClassVar[str] = FAMILY
    n: int = 1 << 20

    def key(self) -> str:
        return f"N{self.n}"


def space(_problem: dict | None = None) -> Space:
    return Space(FAMILY, {}, DIMS, CONSTRAINTS)


space_for, all_spaces, covering_set = fixed_spaces(space)  # one space: nothing picks it


def render_context(variant: Variant) -> dict[str, Any]:
    return {**variant.as_dict(), "name": variant.name}


from .op import _cpu as reference  # noqa: E402,F401
