"""What a declaration (tuner.declare.Op) must hold, said as what to change: checked when a family's
module declares its op (Op.__post_init__), before anything is rendered from it."""

from __future__ import annotations

import math
import re

from . import expression
from .declare_terms import _NAME, SCALAR_TYPES, TORCH_DTYPES, DeclarationError, Scalar, Tensor

FLOATING = {"float32", "float16", "bfloat16", "float64"}
INTEGER = {"uint8", "int8", "int32", "int64"}
LIBRARIES = {"cublas"}  # what tuner/build/libraries.py finds
_PYTHON = {"float": (float, int), "int": int, "bool": bool, "str": str}
# What the rendered C++ names itself: a declared name must not be one of these.
RESERVED = {
    "a", "all", "baseline", "ctx", "got", "grads", "guard", "known", "live", "op", "outs", "pair", "result", "saved",
    "errors", "error_flags", "validates", "workspace", "scratch", "sizes", "stream", "vt", "winner", "abi", "name",
    "forward", "backward", "at", "c10", "ws", "describe", "work", "unguarded", "parts", "device", "blas",
    "std", "torch", "tuner_op",
    # C and C++ keywords a lower-case name could be
    "alignas", "alignof", "and", "asm", "auto", "bool", "break", "case", "catch", "char", "class", "const",
    "constexpr", "continue", "default", "delete", "do", "double", "else", "enum", "explicit", "export", "extern",
    "false", "float", "for", "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new",
    "noexcept", "not", "nullptr", "operator", "or", "private", "protected", "public", "register", "return",
    "short", "signed", "sizeof", "static", "struct", "switch", "template", "this", "throw", "true", "try",
    "typedef", "typeid", "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "while", "xor",
}


def _check_names(op: "Op", fail) -> None:
    """No declared name is one the rendered code uses, nor one it derives from another
    (`grad_<x>`, `<x>_grad`, `<x>_`, `<x>_dtype`, `<x>_sorted`)."""
    declared = [a.name for a in (*op.inputs, *op.outputs, *op.saves)] + list(op.sizes)
    for n in declared:
        if n in RESERVED:
            fail(f"{n!r} is a name the rendered C++ uses itself: choose another")
    derived = {}
    for t in (*op.tensors, *op.outputs):
        for d in (f"grad_{t.name}", f"{t.name}_grad", f"{t.name}_", f"{t.name}_dtype"):
            derived[d] = t.name
    for a in op.scalars:
        if a.optional:
            derived[f"{a.name}_given"] = a.name
    for n in op.sorted if isinstance(op.sorted, tuple) else ():
        derived.update({f"{n}_sorted": n, f"{n}_order": n})
    for g in op.guards if isinstance(op.guards, tuple) else ():
        if isinstance(g, tuple) and g:
            derived.update({f"{g[0]}_safe": g[0], f"{g[0]}_in": g[0], f"{g[0]}_given": g[0]})
    for n in declared:
        if n in derived:
            fail(f"{n!r} is what the rendered C++ names a part of {derived[n]!r}: choose another")
    fields = []
    for f in op.table:  # a function pointer's name is inside its first parentheses
        pointer = re.search(r"\(\s*\*\s*(\w+)\s*\)", f)
        fields.append(pointer.group(1) if pointer else re.findall(r"\w+", f)[-1])
    for f in fields:
        if f in {"abi", "name", "forward", "backward"} | {f"{t.name}_dtype" for t in op.varying} \
                | {f"{p}_work_bytes" for p in op.work} | ({"sorts"} if op.sorted else set()):
            fail(f"table field {f!r}: the table has that field already")


def _python(text: str) -> bool:
    """Whether `text` reads as a Python expression (the search evaluates scratch and workspace lengths)."""
    try:
        compile(text, "<declaration>", "eval")
    except SyntaxError:
        return False
    return True


def _whole(n) -> bool:
    """A shape's number (not a size's name)."""
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def _unreadable(op: "Op", text, number: bool = False, of_sizes: bool = False) -> str:
    """Why a size's, check's or (`of_sizes`) key's expression is none C++ and Python both read ("" where
    it is one)."""
    if not isinstance(text, str):
        return "not a str"
    try:
        if number and expression.boolean(text):
            return "a number, not a truth value"
        if of_sizes:
            expression.cpp(text, set(), set(), {n: "int" for n in op.sizes})
        else:
            expression.cpp(text, {t.name for t in op.tensors}, op.may_be_none, {s.name: s.type for s in op.scalars})
    except expression.ExpressionError as exc:
        return str(exc)
    return ""


def check(op: "tuner.declare.Op") -> None:
    """What a declaration must hold, said as what to change (raised at import of the family)."""
    def fail(message: str):
        raise DeclarationError(f"op {op.name!r}: {message}")

    for a in (*op.inputs, *op.outputs, *op.saves):
        if not isinstance(a, (Tensor, Scalar)):
            fail(f"{a!r} is no tuner.declare.Tensor or Scalar")
    names = [a.name for a in (*op.inputs, *op.outputs, *op.saves)] + list(op.sizes)
    for n in [op.name, *names]:
        if not _NAME.match(n):
            fail(f"{n!r} is not a C identifier in lower case")
    if len(set(names)) != len(names):
        fail(f"a name is used twice among the inputs, outputs and sizes: {names}")
    if not any(isinstance(a, Tensor) for a in op.inputs):
        fail("it takes no tensor")
    if not op.outputs:
        fail("it has no output")
    if not any(isinstance(a, Tensor) and a.grad for a in op.inputs):
        fail("no input tensor takes a gradient (grad=True): the op's backward would have nothing to give")
    inputs = {t.name: t for t in op.inputs if isinstance(t, Tensor)}
    for a in op.inputs:
        if not isinstance(a, (Tensor, Scalar)):
            fail(f"an input is a {type(a).__name__}: declare a tuner.declare.Tensor or Scalar")
        if isinstance(a, Scalar) and a.type not in SCALAR_TYPES:
            fail(f"scalar {a.name} is a {a.type!r}: one of {', '.join(SCALAR_TYPES)}")
    for t in (*inputs.values(), *op.outputs):
        if not isinstance(t, Tensor):
            fail(f"output {t!r} is not a tuner.declare.Tensor")
        if t.like is not None and t.like not in inputs:
            fail(f"{t.name} is like {t.like!r}, which is no input tensor (one of {', '.join(inputs)})")
        if (t.like is None) == (not t.dtypes):
            fail(f"{t.name}: give its dtypes or the input it is like, one of the two")
        bad = [d for d in t.dtypes if d not in TORCH_DTYPES]
        if bad:
            fail(f"{t.name}: unknown dtype {bad[0]!r} (one of {', '.join(TORCH_DTYPES)})")
    for t in (*op.outputs, *op.saves):
        if isinstance(t, Tensor) and (isinstance(t.shape, str) or t.shape is Ellipsis):
            fail(f"{t.name}: shape={t.shape!r}: an output's or saved tensor's shape is a tuple of size names "
                 f"(shape=({t.shape!r},)); an input's alone may name another input")
    for t in op.outputs:  # allocated like an input, or of one dtype and a shape of size names
        if t.like is None and (len(t.dtypes) != 1 or t.shape is None):
            fail(f"output {t.name}: say which input it is allocated like (like=...), or give it one dtype "
                 f"and a shape of size names (shape=() for a number)")
        unknown = [n for n in t.shape or () if not _whole(n) and n not in op.sizes]
        if unknown:
            fail(f"output {t.name}: its shape names {unknown[0]!r}, which is no size (one of {', '.join(op.sizes)})")
    for t in op.tensors:  # an input's shape, where given, is checked against the sizes (else `like`'s)
        if t.shape is Ellipsis:
            continue
        if isinstance(t.shape, str):
            if t.shape == t.name or t.shape not in inputs or inputs[t.shape].optional:
                fail(f"input {t.name}: shape={t.shape!r} names the input it has the shape of: another input tensor, "
                     f"one a call always gives (a shape of sizes is a tuple: shape=({t.shape!r},))")
            continue
        unknown = [n for n in t.shape or () if not _whole(n) and n not in op.sizes]
        if unknown:
            fail(f"input {t.name}: its shape names {unknown[0]!r}, which is no size (one of {', '.join(op.sizes)})")
    for a in op.scalars:
        if (a.type == "str") != bool(a.choices):
            fail(f"scalar {a.name}: a str takes its choices (choices=('none', 'mean', 'sum')), and only a str does")
        if any(not isinstance(c, str) or not re.fullmatch(r"[\w.+-]+", c) for c in a.choices) or \
                len(set(a.choices)) != len(a.choices):
            fail(f"scalar {a.name}: its choices {a.choices!r} must be distinct words (letters, digits, _ . + -)")
        if a.type == "str" and a.default is not None and a.default not in a.choices:
            fail(f"scalar {a.name}: its default {a.default!r} is not one of its choices {a.choices}")
        if a.default is not None and not isinstance(a.default, _PYTHON[a.type]):
            fail(f"scalar {a.name}: its default {a.default!r} is no {a.type}")
        if isinstance(a.default, float) and not math.isfinite(a.default):
            fail(f"scalar {a.name}: its default {a.default!r} is not a finite number")
        if a.optional is not False and (a.optional is not True or a.type not in ("int", "float") or a.default is not None):
            fail(f"scalar {a.name}: optional=True is for an int or float scalar with no default (its default is None)")
    required = False  # torch's schemas give defaults to the last arguments alone
    for a in reversed(op.inputs):
        if isinstance(a, Scalar) and a.default is not None and required:
            fail(f"scalar {a.name} has a default and an input after it has none: torch gives defaults to the last "
                 f"arguments alone (move it after them, or give it no default)")
        required = required or (a.default is None and not a.optional if isinstance(a, Scalar) else not a.optional)
    for t in (*op.tensors, *op.outputs, *op.saves):
        if len(set(t.dtypes)) != len(t.dtypes):
            fail(f"{t.name}: a dtype is named twice in {t.dtypes}")
    if op.alignment < 1 or op.alignment & (op.alignment - 1):
        fail(f"alignment {op.alignment}: a power of two")
    _check_names(op, fail)
    for t in inputs.values():  # `like` chains end at a tensor with dtypes of its own
        chain = [t.name]
        while inputs[chain[-1]].like is not None:
            nxt = inputs[chain[-1]].like
            if nxt in chain:
                fail(f"{' -> '.join(chain + [nxt])}: tensors like each other in a circle")
            chain.append(nxt)
    for t in op.tensors:  # (the chains end: `root` is safe from here)
        if t.grad and not set(op.root(t.name).dtypes) & FLOATING:
            fail(f"input {t.name}: a {'/'.join(op.root(t.name).dtypes)} tensor takes no gradient: grad=False")
    if not op.sizes:
        fail("no sizes: name at least one (e.g. sizes={'n': 'x.numel()'}), the shape key of a winner")
    for n, e in op.sizes.items():
        why = _unreadable(op, e, number=True)
        if why:
            fail(f"size {n}: {e!r} is not an expression C++ and Python both read ({why}; the words: a tensor's "
                 f".size(d), .numel(), .dim(), leading(t), integers, + - *, `a if condition else b`)")
    for c in op.checks:
        why = _unreadable(op, c[0]) if isinstance(c, tuple) and len(c) == 2 and all(isinstance(x, str) for x in c) \
            else "not a pair"
        if why or '"' in c[1]:
            fail(f"check {c!r}: a (condition, message) pair, the condition in the sizes' words with comparisons, "
                 f"and, or, not ({why or 'a message without'}; e.g. ('x.dim() >= 1', 'x must have at least one "
                 f"dimension'))")
    for t in (*op.outputs, *op.saves):
        if isinstance(t, Tensor) and t.optional:
            fail(f"{t.name}: only an input can be optional")
    for t in op.tensors:
        if t.optional not in (False, True, "null"):
            fail(f"{t.name}: optional={t.optional!r}: True (the baseline serves a call without it) or \"null\" "
                 f"(the variants get a null pointer)")
        if t.optional != "null":
            continue
        others = [u.name for u in (*op.tensors, *op.outputs, *op.saves) if u.like == t.name]
        own = len(t.dtypes) == 1 if t.like is None else t.like not in op.nullable
        if not own or t is op.tensors[0] or others:
            fail(f"input {t.name}: an input the variants may get as null is of one dtype or like an input that is "
                 f"always given, is not the first tensor, and no tensor's `like` names it")
    for t in op.tensors:
        if t.converts and (t.grad or t.like is not None or len(t.dtypes) != 1 or t.dtypes[0] not in INTEGER):
            fail(f"input {t.name}: converts=True is for an integer input of one dtype (the variants'), "
                 f"no gradient (grad=False)")
    ints = {m.group(1) for f in op.table if isinstance(f, str) for m in [re.fullmatch(r"\s*int\s+(\w+)\s*", f)] if m}
    for t in (*op.tensors, *op.outputs, *op.saves):
        if isinstance(t, Tensor) and t.only_if is not None and (t not in op.saves or t.only_if not in ints
                                                                  or t.gradient_of is not None):
            fail(f"{t.name}: only_if={t.only_if!r} is for a saved tensor (not a gradient_of one), naming an "
                 f"int field of the table (table=('int {t.only_if}',))")
        if isinstance(t, Tensor) and t.converts and t not in op.tensors:
            fail(f"{t.name}: converts is for an input")
        if isinstance(t, Tensor) and t.when is not None and (t not in op.saves or t.gradient_of is not None):
            fail(f"{t.name}: when is for a saved tensor (not a gradient_of one)")
    if any(isinstance(a, Tensor) and a.optional is True for a in op.inputs) and op.baseline is None:
        fail("an optional input needs a baseline: it serves the calls that leave the input out")
    error_names = [e[0] if isinstance(e, tuple) and len(e) == 2 else None for e in op.errors]
    for e, n in zip(op.errors, error_names):
        if n is None or not isinstance(n, str) or not _NAME.match(n) or not isinstance(e[1], str) or '"' in e[1]:
            fail(f"error {e!r}: a (name, message) pair, the name a C identifier in lower case "
                 f"(e.g. ('target', 'a target is outside [0, vocab)'))")
    if len(set(error_names)) != len(error_names) or len(error_names) > 8:
        fail(f"errors {error_names}: at most 8, each named once")
    if isinstance(op.guards, tuple) and len(op.guards) > 4:
        fail("guards: at most 4 (one launch checks them all)")
    for g in op.guards if isinstance(op.guards, tuple) else (None,):
        if not (isinstance(g, tuple) and len(g) in (3, 4) and g[0] in inputs and isinstance(inputs[g[0]], Tensor)
                and not set(op.root(g[0]).dtypes) - {"int32", "int64"} and g[2] in error_names
                and (g[3:] in ((), ("ascending",)) or g[3] in {a.name for a in op.scalars if a.type == "int"})
                and op.baseline is not None
                and _unreadable(op, g[1], number=True) == ""):
            fail(f"guard {g!r}: (input, bound, error), and 'ascending' or an int scalar whose value is allowed "
                 f"too: an int32/int64 input, an expression of the inputs, a declared error; with a baseline")
    if not isinstance(op.work, tuple) or not set(op.work) <= {"forward", "backward"} or len(set(op.work)) != len(op.work):
        fail(f"work={op.work!r}: the passes that get it, a tuple of 'forward' and 'backward'")
    if not isinstance(op.libraries, tuple) or not set(op.libraries) <= LIBRARIES:
        fail(f"libraries={op.libraries!r}: a tuple of the libraries the variants call, of {sorted(LIBRARIES)}")
    if not isinstance(op.key, tuple):
        fail(f"key={op.key!r}: a tuple of expressions of the sizes, e.g. ('dim', 'ratio(n, bags)')")
    for e in op.key:
        why = _unreadable(op, e, number=True, of_sizes=True)
        if why:
            fail(f"key {e!r}: an expression of the sizes ({', '.join(op.sizes)}) with + - * and ratio(a, b) ({why})")
    if not isinstance(op.loose, int) or isinstance(op.loose, bool) or not 0 <= op.loose < max(len(op.key), 1):
        fail(f"loose={op.loose!r}: how many of the key's last sizes the reach leaves out, fewer than the key's "
             f"{len(op.key)} (a key to name them: key=('dim', 'bag_size', 'bags'), loose=1)")
    if not isinstance(op.sorted, tuple) or len(set(op.sorted)) != len(op.sorted) or any(
            n not in inputs or inputs[n].optional or set(op.root(n).dtypes) - INTEGER for n in op.sorted):
        fail(f"sorted={op.sorted!r}: a tuple of integer input tensors a call always gives (e.g. ('indices',))")
    if not isinstance(op.zeroed, tuple) or not set(op.zeroed) <= {t.name for t in op.differentiable} or any(
            t.gradient_of in op.zeroed for t in op.saves):
        fail(f"zeroed={op.zeroed!r}: a tuple of inputs that take a gradient the backward allocates (not a saved one)")
    if op.kind is not None and op.kind not in {a.name for a in op.scalars if a.type == "str"}:
        fail(f"kind={op.kind!r}: the name of a str scalar, whose word a call's winner is kept by")
    for what, e in (("scratch", op.scratch), ("workspace", op.workspace)):
        if e is not None and (not isinstance(e, str) or ";" in e or not _python(e.replace("->", "."))):
            fail(f"{what} {e!r}: a C++ expression of vt and sizes that the search reads as Python too (vt->f as "
                 f"vt.f; no ?:, a * (c > 0) instead), e.g. 'vt->{what}_words(sizes[0])'")
    for field_ in op.table:
        if not isinstance(field_, str) or ";" in field_ or not re.search(r"\w\s*\)?\s*(\(.*\))?\s*$", field_):
            fail(f"table field {field_!r}: one C declaration without its ';' (e.g. 'int vec')")
    words = {a.name: a.choices for a in op.scalars if a.type == "str"}
    for t in (*op.tensors, *op.outputs, *op.saves):
        if isinstance(t, Tensor) and t.reduced_by is not None:
            if t in op.tensors or t.shape is None:
                fail(f"{t.name}: reduced_by is for an output with a shape (its shape where the word is 'none')")
            if "none" not in words.get(t.reduced_by, ()):
                fail(f"{t.name}: reduced by {t.reduced_by!r}, which is no str scalar with 'none' among its choices")
    for t in op.saves:
        if isinstance(t, Tensor) and t.gradient_of is not None:
            if t.gradient_of not in [d.name for d in op.differentiable] or t.like != t.gradient_of:
                fail(f"saved {t.name}: the gradient of {t.gradient_of!r} must be like it (like={t.gradient_of!r}), "
                     f"an input that takes a gradient")
            if [s.gradient_of for s in op.saves].count(t.gradient_of) > 1:
                fail(f"saved {t.name}: {t.gradient_of} has one gradient saved")
            if t.in_place is not None and t.in_place not in [a.name for a in op.scalars if a.type == "bool"]:
                fail(f"saved {t.name}: in_place={t.in_place!r} names no bool scalar of the op")
            continue
        if isinstance(t, Tensor) and t.in_place is not None:
            fail(f"saved {t.name}: in_place is for a saved gradient (gradient_of=...)")
        if not isinstance(t, Tensor) or len(t.dtypes) != (0 if t.like else 1) or t.shape is None \
                or (t.like is not None and t.like not in inputs):
            fail(f"saved {getattr(t, 'name', t)!r}: a Tensor of one dtype (or like an input) and a shape of size "
                 f"names (e.g. Tensor('rstd', dtypes=('float32',), shape=('rows',)); shape=() for a number)")
        if t.when is not None:
            scalar, wanted = t.when if isinstance(t.when, tuple) and len(t.when) == 2 else (None, ())
            if not wanted or not isinstance(wanted, tuple) or not set(wanted) <= set(words.get(scalar, ())) \
                    or t.only_if is not None:
                fail(f"saved {t.name}: when={t.when!r} is (a str scalar's name, a tuple of its choices), e.g. "
                     f"('mode', ('max',)), and not with only_if")
        if t.like is None and t.dtypes[0] not in TORCH_DTYPES:
            fail(f"saved {t.name}: unknown dtype {t.dtypes[0]!r} (one of {', '.join(TORCH_DTYPES)})")
        unknown = [n for n in t.shape if not _whole(n) and n not in op.sizes]
        if unknown:
            fail(f"saved {t.name}: its shape names {unknown[0]!r}, which is no size (one of {', '.join(op.sizes)})")
