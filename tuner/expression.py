"""A declaration's sizes and checks (tuner.declare): Python expressions of the op's inputs, which
Python evaluates as they are and the op's C++ gets rendered from (torch alone: exported wheels
carry this file).

Their words: a tensor's `.size(d)`, `.numel()`, `.dim()`, `leading(t)` (the product of its sizes
but the last), `ratio(a, b)` (a // b of sizes, 0 where b is 0), integers, `+ - *`, comparisons,
`and`, `or`, `not`, `a if condition else b`, an input the caller may leave out compared with None
(`offsets is None`), a word compared with a str scalar (`mode == "max"`), and the scalars. No `/` or `//`: C++ and Python divide integers apart
(`ratio` is the same in both for the sizes it takes, which are not negative).
"""

from __future__ import annotations

import ast
import functools
import json

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_METHODS = {"size": 1, "numel": 0, "dim": 0}  # a tensor's, by the arguments they take
FUNCTIONS = {"leading": ("tensor",), "ratio": ("number", "number")}  # by what each argument is


class ExpressionError(ValueError):
    """An expression outside the words above, with the part that is."""


@functools.cache
def parse(text: str) -> ast.Expression:
    try:
        return ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"not Python: {exc.msg}") from None


def cpp(text: str, tensors: set[str], nullable: set[str] = frozenset(), scalars: dict[str, str] | None = None) -> str:
    """The C++ of an expression, checked: `tensors` the input tensors' names (`nullable`, those
    the C++ holds as std::optional), `scalars` the scalars' types by name. Raises ExpressionError."""
    found = _Cpp(tensors, nullable, scalars or {}).visit(parse(text).body)
    return found[1:-1] if _enclosed(found) else found


def _enclosed(text: str) -> bool:
    """Whether the whole of `text` is one pair of parentheses (left out at the top)."""
    if not text.startswith("("):
        return False
    depth = 0
    for i, c in enumerate(text):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0:
            return i == len(text) - 1
    return False


def boolean(text: str) -> bool:
    """Whether an expression gives a truth value (a comparison, `and`/`or`/`not`) rather than a number."""
    body = parse(text).body
    return isinstance(body, (ast.Compare, ast.BoolOp)) or (isinstance(body, ast.UnaryOp)
                                                            and isinstance(body.op, ast.Not))


class _Cpp(ast.NodeVisitor):
    def __init__(self, tensors, nullable, scalars):
        self.tensors, self.nullable, self.scalars = set(tensors), set(nullable), dict(scalars)

    def generic_visit(self, node):
        raise ExpressionError(f"{ast.unparse(node)!r} is none of a declaration's words")

    def tensor(self, node) -> str:
        """A tensor as C++ reads its sizes (one the caller may leave out: its value, which must be there)."""
        if not (isinstance(node, ast.Name) and node.id in self.tensors):
            raise ExpressionError(f"{ast.unparse(node)!r} is no input tensor")
        return f"{node.id}.value()" if node.id in self.nullable else node.id

    def visit_Name(self, node):
        if node.id in self.tensors:
            raise ExpressionError(f"tensor {node.id} is read by its sizes (.size(d), .numel(), .dim())")
        if node.id not in self.scalars:
            raise ExpressionError(f"{node.id!r} is no input")
        if node.id in self.nullable:  # a number the caller may leave out: its value, which must be there
            return f"{node.id}.value()"
        if self.scalars[node.id] == "str":
            raise ExpressionError(f"{node.id} is a word: compare it with one ({node.id} == \"...\")")
        return node.id

    def visit_Constant(self, node):
        if isinstance(node.value, bool):
            return "true" if node.value else "false"
        if isinstance(node.value, int):
            return str(node.value)
        if isinstance(node.value, str):
            raise ExpressionError(f"{node.value!r}: a word is compared with a str scalar (mode == \"max\")")
        raise ExpressionError(f"{node.value!r}: a number or a word")

    def visit_UnaryOp(self, node):
        if isinstance(node.op, ast.Not):
            return f"!{self.visit(node.operand)}"
        if isinstance(node.op, ast.USub):
            inner = self.visit(node.operand)
            return f"-{inner}" if isinstance(node.operand, ast.Constant) else f"(-{inner})"
        return self.generic_visit(node)

    def visit_BinOp(self, node):
        if type(node.op) not in _BINARY:
            raise ExpressionError(f"{ast.unparse(node)!r}: + - * alone (C++ and Python divide integers apart)")
        return f"({self.visit(node.left)} {_BINARY[type(node.op)]} {self.visit(node.right)})"

    def visit_BoolOp(self, node):
        joint = " && " if isinstance(node.op, ast.And) else " || "
        return "(" + joint.join(self.visit(v) for v in node.values) + ")"

    def visit_IfExp(self, node):
        return f"({self.visit(node.test)} ? {self.visit(node.body)} : {self.visit(node.orelse)})"

    def visit_Compare(self, node):
        if len(node.ops) != 1:
            raise ExpressionError(f"{ast.unparse(node)!r}: one comparison at a time (C++ chains none)")
        (op,), (right,), left = node.ops, node.comparators, node.left
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not (isinstance(right, ast.Constant) and right.value is None and isinstance(left, ast.Name)
                    and left.id in self.nullable):
                raise ExpressionError(f"{ast.unparse(node)!r}: `is None` is for an input the caller may leave out "
                                      f"(optional)")
            return f"{'!' if isinstance(op, ast.Is) else ''}{left.id}.has_value()"
        if type(op) not in _COMPARE:
            return self.generic_visit(node)
        if any(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in (left, right)):
            word, scalar = (left, right) if isinstance(left, ast.Constant) else (right, left)
            if not (isinstance(scalar, ast.Name) and self.scalars.get(scalar.id) == "str"
                    and isinstance(op, (ast.Eq, ast.NotEq))):
                raise ExpressionError(f"{ast.unparse(node)!r}: a word is compared (== or !=) with a str scalar")
            return f"({scalar.id} {_COMPARE[type(op)]} {json.dumps(word.value)})"
        return f"({self.visit(left)} {_COMPARE[type(op)]} {self.visit(right)})"

    def visit_Call(self, node):
        if node.keywords:
            return self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in _METHODS and len(node.args) == _METHODS[f.attr]:
            return f"{self.tensor(f.value)}.{f.attr}({', '.join(self.visit(a) for a in node.args)})"
        takes = FUNCTIONS.get(f.id, ()) if isinstance(f, ast.Name) else ()
        if takes and len(takes) == len(node.args):
            args = [self.tensor(a) if t == "tensor" else self.visit(a) for t, a in zip(takes, node.args)]
            return f"{f.id}({', '.join(args)})"
        return self.generic_visit(node)
