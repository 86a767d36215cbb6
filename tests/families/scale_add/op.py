"""scale_add's op, `torch.ops.tuner.scale_add(x, y, alpha)`, bound by tuner's runtime: the C++
rendered from the family's declaration runs the winner on CUDA; here, the CPU reference and the
fake of the op and of its backward."""

from __future__ import annotations

from tuner import runtime

NAMESPACE = "tuner_scale_add"


def _cpu(x, y, alpha):
    return (alpha * x.double() + y.double()).to(x.dtype)


def _cpu_backward(grad_out, x, y, alpha, x_grad, y_grad):
    g = grad_out.double().expand(x.shape)
    return ((alpha * g).to(x.dtype) if x_grad else x.new_empty(0), g.to(y.dtype) if y_grad else y.new_empty(0))


def _fake_backward(grad_out, x, y, alpha, x_grad, y_grad):
    return (x.new_empty(x.shape if x_grad else (0,)), y.new_empty(y.shape if y_grad else (0,)))


OP = runtime.OpSpec(family="scale_add", op="scale_add", namespace=NAMESPACE, abi=1,
                    shape=lambda problem: ([problem["n"]], 0),
                    impls={"scale_add": (_cpu, lambda x, y, alpha: x.new_empty(x.shape)),
                           "scale_add_backward": (_cpu_backward, _fake_backward)})
