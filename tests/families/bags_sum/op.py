"""bags_sum's op, `torch.ops.tuner.bags_sum(indices, scale, mode, weight, padding_idx=None)`,
declared: the core renders its C++ and C ABI, and its CPU and fake kernels from the reference."""

from __future__ import annotations

from tuner import declare, opspec

OP_DECLARATION = declare.Op(
    "bags_sum",
    inputs=(declare.Tensor("indices", dtypes=("int64",), grad=False, shape=("bags", "per")),
            declare.Tensor("scale", like="weight", shape=("bags", "per"), optional="null"),
            declare.Scalar("mode", "str", choices=("sum", "max")),
            declare.Tensor("weight", dtypes=("float32",)),
            declare.Scalar("padding_idx", "int", optional=True)),
    outputs=(declare.Tensor("out", like="weight", shape=("bags", "dim")),),
    sizes={"bags": "indices.size(0)", "per": "indices.size(1)", "dim": "weight.size(1)", "rows": "weight.size(0)"},
    checks=(("indices.dim() == 2", "indices must be [bags, per]"), ("weight.dim() == 2", "weight must be 2-D"),
            ("padding_idx is None or (padding_idx >= -weight.size(0) and padding_idx < weight.size(0))",
             "padding_idx must be within [-rows, rows)")),
    saves=(declare.Tensor("chosen", dtypes=("int64",), shape=("bags", "dim"), when=("mode", ("max",))),),
    work=("forward", "backward"),
    key=("per", "dim"), kind="mode",  # winners by bag length and width, a call's mode preferred
    sorted=("indices",),  # a deterministic backward reads the entries in row order
)


def reference(indices, scale, mode, weight, padding_idx=None):
    """A padded entry counts as a row of zeros (in a max too)."""
    rows = weight.double()[indices]  # [bags, per, dim]
    if padding_idx is not None:
        rows = rows * (indices != padding_idx % weight.shape[0])[..., None]
    if scale is not None:
        rows = rows * scale.double()[..., None]
    return rows.sum(1) if mode == "sum" else rows.amax(1)


OP = opspec.spec(OP_DECLARATION, "bags_sum", reference=reference, torch_op=lambda *a: reference(*a).float())
