"""A declaration's sizes and checks (tuner/expression.py): Python expressions that Python evaluates
as written and the op's C++ is rendered from; both sides must agree, and an expression outside
the words says which part is."""

from __future__ import annotations

import re

import pytest

from tuner import expression, opspec

import probe_ops
from probe_ops import WHERE

TENSORS, NULLABLE = {"x", "offsets", "indices"}, {"offsets", "pad"}  # pad: an optional int
SCALARS = {"mode": "str", "k": "int", "last": "bool", "pad": "int"}


@pytest.mark.parametrize("text,cpp", [
    ("x.dim() >= 1", "x.dim() >= 1"),
    ("leading(x) * x.size(-1)", "leading(x) * x.size(-1)"),
    ("indices.size(0) if indices.dim() == 2 else offsets.numel() - last",
     "(indices.dim() == 2) ? indices.size(0) : (offsets.value().numel() - last)"),
    ("offsets is None or mode == 'sum'", '!offsets.has_value() || (mode == "sum")'),
    ("not (k > 2 and x.numel() < 3)", "!((k > 2) && (x.numel() < 3))"),
    ("offsets is not None", "offsets.has_value()"),
    ("pad is None or pad >= -x.size(0)", "!pad.has_value() || (pad.value() >= (-x.size(0)))"),
    ("ratio(indices.numel(), k + 1)", "ratio(indices.numel(), (k + 1))"),
])
def test_an_expression_renders_as_the_same_cpp(text, cpp):
    assert expression.cpp(text, TENSORS, NULLABLE, SCALARS) == cpp


@pytest.mark.parametrize("text,why", [
    ("x.numel() / 2", "+ - * alone (C++ and Python divide integers apart)"),
    ("x.dim() && 1", "not Python"),
    ("1 < k < 3", "one comparison at a time"),
    ("mode + 1", "mode is a word: compare it with one"),
    ("k == 'max'", "a word is compared (== or !=) with a str scalar"),
    ("x + 1", "tensor x is read by its sizes"),
    ("y.numel()", "'y' is no input tensor"),
    ("x is None", "`is None` is for an input the caller may leave out"),
    ("x.stride(0)", "'x.stride(0)' is none of a declaration's words"),
    ("k ** 2", "+ - * alone"),
    ("k // 2", "+ - * alone"),
    ("ratio(x, 2)", "tensor x is read by its sizes"),
    ("leading(k)", "'k' is no input tensor"),
])
def test_an_expression_outside_the_words_says_which_part(text, why):
    with pytest.raises(expression.ExpressionError, match=re.escape(why)):
        expression.cpp(text, TENSORS, NULLABLE, SCALARS)




def _where_reference(x, m, w, mode):
    return x.double() * (1 + w.double().sum())


def test_cpp_and_python_read_a_declaration_s_expressions_alike():
    """The same calls refused with the same words by the rendered C++ and by tuner/opspec.py, and
    the same sizes (seen in the shape a shaped input is checked against)."""
    import torch

    from tuner import runtime

    probe_ops.library()
    impls = opspec.impls(WHERE, _where_reference, None)
    runtime.register_python(type("Spec", (), {"impls": impls}))
    x2, x1, m = torch.randn(3, 4), torch.randn(4), torch.arange(2)
    calls = [
        ((torch.randn(2, 2, 2), None, torch.randn(1, 0), "plain"), "where_probe: x must be 1-D or 2-D"),
        ((x2, m, torch.randn(3, 2), "plain"), "where_probe: m is for mode count"),
        ((x1, None, torch.randn(2, 0), "plain"), r"where_probe: w must have shape \[1, 0\] \(rows, given\), got \[2, 0\]"),
        ((x2, m, torch.randn(3, 3), "count"), r"where_probe: w must have shape \[3, 2\] \(rows, given\), got \[3, 3\]"),
    ]
    for args, message in calls:
        with pytest.raises(ValueError, match=message):
            torch.ops.tuner.where_probe(*args)
        with pytest.raises(ValueError, match=message):
            opspec.check(WHERE, opspec.bind(WHERE, args))
    for args, rows_given in (((x2, m, torch.randn(3, 2), "count"), [3, 2]), ((x1, None, torch.randn(1, 0), "plain"), [1, 0])):
        assert opspec.sizes(WHERE, opspec.bind(WHERE, args)) == rows_given
        torch.testing.assert_close(torch.ops.tuner.where_probe(*args), _where_reference(*args).float())
