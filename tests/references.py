"""A family's float64 answers in tests: its reference's outputs and gradients, as the search checks
variants against them (tuner.opspec.reference_answers)."""

import torch

from tuner import opspec


def with_grad(family, *args, grad_out=None):
    """(the reference's output, the gradient of its first differentiable input) of `family`'s op
    at `args`, for the output's gradient `grad_out` (ones where None)."""
    if grad_out is None:
        (out,), _ = opspec.reference_answers(family.OP_DECLARATION, family.reference, args, [torch.ones(())])
        grad_out = torch.ones_like(out)
    (out,), grads = opspec.reference_answers(family.OP_DECLARATION, family.reference, args, [grad_out])
    return out, grads[0]
