"""scale_add's op, `torch.ops.tuner.scale_add(x, y, alpha)`, bound by tuner's runtime: the C++
op (templates/scale_add_op.cpp) runs the winner on CUDA; here, the CPU reference and the fake."""

from __future__ import annotations

from tuner import runtime

NAMESPACE = "tuner_scale_add"


def _cpu(x, y, alpha):
    return (alpha * x.double() + y.double()).to(x.dtype)


OP = runtime.OpSpec(family="scale_add", op="scale_add", namespace=NAMESPACE, abi=1,
                    shape=lambda problem: ([problem["n"]], 0),
                    impls={"scale_add": (_cpu, lambda x, y, alpha: x.new_empty(x.shape))})
