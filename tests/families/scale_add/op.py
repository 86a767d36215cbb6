"""scale_add's op, `torch.ops.tuner.scale_add(x, y, alpha)`, declared: the core renders its C++ and
C ABI from OP_DECLARATION (tuner/build/declared.py), and its CPU and fake kernels from the float64
reference (tuner/opspec.py)."""

from __future__ import annotations

from tuner import declare, opspec

OP_DECLARATION = declare.Op(
    "scale_add",
    inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("y", like="x"), declare.Scalar("alpha")),
    outputs=(declare.Tensor("out", like="x"),),
    sizes={"n": "x.numel()"},
    baseline="x * alpha + y",  # torch's, for calls outside float32 and those no variant beat
)


def reference(x, y, alpha):
    return alpha * x.double() + y.double()


OP = opspec.spec(OP_DECLARATION, "scale_add", reference=reference, torch_op=lambda x, y, alpha: x * alpha + y)
