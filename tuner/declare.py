"""A family's op, declared: its arguments, outputs and shape key, from which the core renders
the op's C++ (schema, checks, dispatch to the bound winner, the autograd function) and its C ABI
(the argument structs and the variants' table): tuner/build/declared.py.

    OP_DECLARATION = declare.Op(
        "scale_add",
        inputs=(declare.Tensor("x", dtypes=("float32",)), declare.Tensor("y", like="x"), declare.Scalar("alpha")),
        outputs=(declare.Tensor("out", like="x"),),
        sizes={"n": "x.numel()"},
        baseline="x * alpha + y",  # optional: torch's op, serving calls outside the variants' dtypes
    )

A variant's table then holds `forward(const Args*, stream)` and `backward(const BackwardArgs*,
stream)`. `Args` holds each input tensor's pointer (`const void*`), each output's and each saved
tensor's (`void*`), each scalar and each size (`long long`), in that order; `BackwardArgs` each
output's gradient, each input tensor, each saved tensor, each input tensor's gradient (`void*`,
null where autograd wants none: a frozen weight), the scratch memory where declared, the scalars
and the sizes. Where a tensor may take several dtypes, the table names the one a variant takes
(`const char* <name>_dtype`, c10's name: "BFloat16"), and the op picks among the dtype pairs those
names make; `Op.table` adds fields of the family's own after them.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

from . import expression

TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64", "uint8", "int8", "int32", "int64")
# C++ (the op's kernels), C (the argument structs: a str is the index of its value among its choices)
SCALAR_TYPES = {"float": ("double", "float"), "int": ("int64_t", "long long"), "bool": ("bool", "int"),
                "str": ("c10::string_view", "int")}
_NAME = re.compile(r"[a-z_][a-z0-9_]*\Z")


class DeclarationError(ValueError):
    """A declaration the core cannot render, with what to change."""


@dataclass(frozen=True)
class Tensor:
    """A tensor argument or output. `dtypes`: those a variant may take; `like`: another tensor's
    device and dtype, and its shape where no `shape` is given (for an output: allocated like it;
    else an output has one dtype and a `shape` of size names). An input with `grad` gets a
    gradient from the op's backward."""

    name: str
    dtypes: tuple[str, ...] = ()
    like: str | None = None
    grad: bool = True
    # by the op's size names (or whole numbers: ("batch", "slots", 4)): an output's or saved tensor's, an input's
    # checked; or, of an input, another input's name: it has that one's shape (a bag's per-sample weights, the
    # indices'), or `...`: any shape (an input `like` another for its dtype alone: a bag's offsets)
    shape: tuple[str | int, ...] | str | type(Ellipsis) | None = None
    # An input the caller may leave out (`Tensor?`): True, the baseline serves such a call; "null", the
    # variants get a null pointer for it (and for its gradient: a bag's per-sample weights), where
    # it is of one dtype or like another input; sizes and checks may ask `m is None`.
    optional: bool | str = False
    # An output that a word reduces: the name of a str scalar with "none" among its choices; the
    # output has `shape` where it is "none", and is a number (shape ()) for every other word.
    reduced_by: str | None = None
    # A saved tensor that is the gradient of an input (`like` it): the forward may write the
    # gradient there (a variant that computes it in the forward, for an output gradient of 1),
    # and the backward writes or scales it in place and returns it, so that no gradient is
    # allocated in the backward. The forward gets a null pointer where no gradient will be asked for.
    gradient_of: str | None = None
    # For a saved gradient: the name of a bool Scalar that, where a caller sets it, makes the gradient
    # the input's own storage (no allocation: the input is overwritten by its gradient, as Liger's
    # cross-entropy does). The kernels must read an element before they write its gradient.
    in_place: str | None = None
    # An integer input that takes any integer dtype (counts as int32, say): the op converts it to its
    # one declared dtype before the variants see it.
    converts: bool = False
    # A saved tensor that only some variants write (a gradient a fused forward computes): the name of
    # an int field of the table (`table=("int saves_grad",)`); the forward and backward get a null
    # pointer for it where the variant's field is 0, and the op keeps room for it only where a
    # backward follows and a winner of the call's dtype pair writes it ([0] else).
    only_if: str | None = None
    # A saved tensor the forward writes for some words of a str scalar alone (a bag's argmax, for
    # mode "max"): (the scalar's name, those words); the op keeps no room for it ([0]) and the
    # variants get a null pointer for it at the other words, and in a forward no backward follows.
    when: tuple | None = None


@dataclass(frozen=True)
class Scalar:
    """A number the op takes: `type` float, int or bool, with an optional default; or a word
    (`type="str"`) among `choices` (a reduction: "none", "mean", "sum"), which a variant gets as
    the index of the word among them."""

    name: str
    type: str = "float"
    default: float | int | bool | str | None = None
    choices: tuple[str, ...] = ()
    # A number the caller may leave out (`int? padding_idx=None`): the variants get it as 0 there,
    # and `<name>_given` (0 or 1) beside it; sizes and checks may ask `padding_idx is None`.
    optional: bool = False


@dataclass(frozen=True)
class Op:
    """The op `name` (`torch.ops.tuner.<name>`): its inputs (Tensors and Scalars, in call order),
    outputs (Tensors `like` an input), and `sizes`: name -> an expression of the inputs, the shape
    key that picks the nearest winner (and a field of the argument structs): a Python expression
    that tuner/opspec.py evaluates and the op's C++ is rendered from (tuner/expression.py: a
    tensor's `.size(d)`, `.numel()`, `.dim()`, `leading(t)`, integers, `+ - *`, `a if c else b`,
    `m is None` for an input the caller may leave out, and the scalars). `saves`: more
    tensors the forward writes for the backward alone (a row's 1/rms, say), each of one dtype and
    a `shape` of size names; the op then has a `<name>_forward` that returns them too."""

    name: str
    inputs: tuple
    outputs: tuple
    sizes: dict = field(default_factory=dict)
    saves: tuple = ()
    alignment: int = 16  # bytes a variant may assume of every tensor's pointer
    abi: int = 1
    # The torch op the family replaces, as C++ of the inputs giving the output(s) (at:: calls), or
    # statements that end in a `return` of them: it serves calls outside the declared dtypes and
    # those no variant was tuned near or beat.
    baseline: str | None = None
    # More fields of a variant's table, C declarations ("int vec", "long long (*scratch_floats)(long
    # long rows, long long width)"), after the dtypes: what a variant tells the op (or the search).
    table: tuple[str, ...] = ()
    # float32 scratch memory the backward gets (`float* scratch`, any contents: a kernel that sums
    # into it clears it on its stream): an expression of `vt` (the variant's table) and `sizes` (the
    # size values, in order) giving its length, e.g. "vt->scratch_floats(sizes[0], sizes[1])"; the
    # search reads it in Python too, `vt->` as `vt.` (tuner/measure/declared.py).
    scratch: str | None = None
    # 32-bit words the forward gets zeroed (`unsigned* workspace`) and must leave zeroed: a last block's
    # ticket and running sums, kept per device and stream between calls. Its length as `scratch`'s is
    # written ("vt->workspace_words(sizes[0])"); it follows the errors' word in the same memory.
    workspace: str | None = None
    # The passes ("forward", "backward") that get `void* work`: memory of any contents that the
    # variant sizes from the call's arguments, `long long (*<pass>_work_bytes)(const <its args>*)`
    # in its table (added by the core; 0 bytes: a null pointer, nothing allocated), where no expression
    # of sizes says it: a split reduction's partials, where the split depends on the call; a sort's buffers.
    work: tuple[str, ...] = ()
    # The shape key a winner is picked by, where it is not every size: expressions of the sizes by
    # name (("dim", "ratio(n, bags)"): a bag's mean length), and `kind`, a str scalar whose word a
    # call prefers its winner tuned at (a bag's mode; the problem then names it).
    key: tuple[str, ...] = ()
    kind: str | None = None
    # What a call must hold beyond dtypes and shapes: (condition, message) pairs, each condition an
    # expression of the inputs as `sizes` are ("x.dim() >= 1"), checked first, refused with
    # "<op>: <message>".
    checks: tuple = ()
    # Bad input the forward's kernels find in values, not shapes (a target outside the vocabulary):
    # (name, message) pairs, the i-th bit i. A kernel reports one with `tuner_<op>_report(errors,
    # error_flags, i)` (the ABI header; the forward's args hold both), a variant says in its table's
    # `validates` whether it does; the op raises
    # tuner.KernelInputError("<op>: invalid input: <message>") as the validate mode says
    # (tuner.set_validate: "async", a later call; "sync", this one; "deferred", tuner.check_errors()).
    errors: tuple = ()
    # Integer inputs the backward may get sorted (a scatter's rows in order, for a deterministic sum without
    # atomics): `<name>_sorted`, its entries as int64 in stable ascending order, and `<name>_order`, the
    # position in it of each, in the backward's args; made with torch's sort on each call where the
    # variant's table sets `sorts` (a field the core adds) and a gradient is wanted, null else.
    sorted: tuple[str, ...] = ()
    # Inputs whose gradient the backward gets zeroed (a scatter adds into it, and rows no entry names
    # stay 0): the op allocates it zeroed before anything else of the backward (its sort, say), as
    # torch does; the search zeroes it once, outside the timed call.
    zeroed: tuple[str, ...] = ()
    # Integer inputs torch's op (the baseline) must not see out of range: (input, bound, error) or
    # (input, bound, error, "ascending"), the bound an expression of the inputs as a check's is.
    # Where the baseline serves a CUDA call, one kernel checks each entry is in [0, bound) (and not
    # below the one before it: "ascending") and reports `error` as a validating variant does, and
    # torch's op gets a copy with entries outside clamped into range: a bad index never reaches
    # torch's device-side assert, which would end the process's CUDA context.
    guards: tuple = ()

    def __post_init__(self):
        check(self)

    @property
    def error_text(self) -> dict[int, str]:
        """Each declared error's bit (error i: 1 << i) -> its message."""
        return {1 << i: message for i, (_, message) in enumerate(self.errors)}

    @functools.cached_property
    def sized_checks(self) -> list[tuple[str, str]]:
        """The checks that read sizes (`.size(d)`, `.numel()`, `leading(t)`): made once the shapes are
        concrete (a graph traced with symbolic shapes makes them when it runs); the others first."""
        return [c for c in self.checks if re.search(r"\.(size|numel)\(|\bleading\(", c[0])]

    # ---------------------------------------------------------- derived

    @property
    def structs(self) -> dict[str, str]:
        """The C names of its argument structs and variant table, as the header declares them."""
        camel = "".join(part.capitalize() for part in self.name.split("_"))
        return {"args": f"Tuner{camel}Args", "bwd_args": f"Tuner{camel}BackwardArgs", "vtable": f"Tuner{camel}Vtable"}

    @functools.cached_property  # read on every call of the search's kernels
    def tensors(self) -> list[Tensor]:
        return [a for a in self.inputs if isinstance(a, Tensor)]

    @functools.cached_property
    def scalars(self) -> list[Scalar]:
        return [a for a in self.inputs if isinstance(a, Scalar)]

    @functools.cached_property
    def nullable(self) -> list[str]:
        """The inputs the variants may get as a null pointer (optional="null")."""
        return [t.name for t in self.tensors if t.optional == "null"]

    @property
    def may_be_none(self) -> set[str]:
        """The inputs a call may leave out that the variants still serve (`m is None` asks)."""
        return {*self.nullable, *(s.name for s in self.scalars if s.optional)}

    @functools.cached_property
    def differentiable(self) -> list[Tensor]:
        return [t for t in self.tensors if t.grad]

    def root(self, name: str) -> Tensor:
        """The tensor whose dtypes `name` takes (following `like`)."""
        by_name = {t.name: t for t in (*self.tensors, *self.outputs)}
        t = by_name[name]
        while t.like is not None:
            t = by_name[t.like]
        return t

    @functools.cached_property
    def varying(self) -> list[Tensor]:
        """Input tensors with several dtypes of their own: each is named in the variants' table."""
        return [t for t in self.tensors if t.like is None and len(t.dtypes) > 1]

    @property
    def pairs(self) -> int:
        n = 1
        for t in self.varying:
            n *= len(t.dtypes)
        return n

    def schema(self) -> str:
        """The op's: an optional tensor defaults to None where every input after it has a default
        too (a call may leave it out)."""
        args, defaulted = [], True
        for a in reversed(self.inputs):
            if isinstance(a, Tensor):
                defaulted = defaulted and bool(a.optional)
                args.append(f"Tensor{'?' if a.optional else ''} {a.name}{'=None' if a.optional and defaulted else ''}")
            else:
                defaulted = defaulted and (a.default is not None or a.optional)
                default = "=None" if a.optional else "" if a.default is None else f"={_schema_value(a.default)}"
                args.append(f"{a.type}{'?' if a.optional else ''} {a.name}{default}")
        args.reverse()
        outs = "Tensor" if len(self.outputs) == 1 else "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        return f"{self.name}({', '.join(args)}) -> {outs}"

    def forward_schema(self) -> str:
        """`<name>_forward`'s, where the op saves tensors: the outputs, then the saved ones."""
        args = [(f"Tensor? {a.name}" if a.name in self.nullable else f"Tensor {a.name}") if isinstance(a, Tensor)
                else f"{a.type}{'?' if a.optional else ''} {a.name}" for a in self.inputs]
        outs = ", ".join("Tensor" for _ in (*self.outputs, *self.saves))
        return f"{self.name}_forward({', '.join(args)}) -> ({outs})"

    def backward_schema(self) -> str:
        grads = [f"Tensor grad_{o.name}" for o in self.outputs]
        args = [f"Tensor{'?' if t.name in self.nullable else ''} {t.name}" for t in (*self.tensors, *self.saves)]
        args += [f"{s.type}{'?' if s.optional else ''} {s.name}" for s in self.scalars]
        wants = [f"bool {t.name}_grad" for t in self.differentiable]
        n = len(self.differentiable)  # one gradient is a Tensor (torch reads "(Tensor)" as one too)
        outs = "Tensor" if n == 1 else "(" + ", ".join("Tensor" for _ in self.differentiable) + ")"
        return f"{self.name}_backward({', '.join(grads + args + wants)}) -> {outs}"


FLOATING = {"float32", "float16", "bfloat16", "float64"}
INTEGER = {"uint8", "int8", "int32", "int64"}
_PYTHON = {"float": (float, int), "int": int, "bool": bool, "str": str}
# What the rendered C++ names itself: a declared name must not be one of these.
RESERVED = {
    "a", "all", "baseline", "ctx", "got", "grads", "guard", "known", "live", "op", "outs", "pair", "result", "saved",
    "errors", "error_flags", "validates", "workspace", "scratch", "sizes", "stream", "vt", "winner", "abi", "name",
    "forward", "backward", "at", "c10", "ws", "describe", "work",
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


def _schema_value(v) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    return ("True" if v else "False") if isinstance(v, bool) else repr(v)


def check(op: Op) -> None:
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
                and g[3:] in ((), ("ascending",)) and op.baseline is not None
                and _unreadable(op, g[1], number=True) == ""):
            fail(f"guard {g!r}: (input, bound, error) or (input, bound, error, 'ascending'): an int32/int64 input, "
                 f"an expression of the inputs, a declared error; with a baseline")
    if not isinstance(op.work, tuple) or not set(op.work) <= {"forward", "backward"} or len(set(op.work)) != len(op.work):
        fail(f"work={op.work!r}: the passes that get it, a tuple of 'forward' and 'backward'")
    if not isinstance(op.key, tuple):
        fail(f"key={op.key!r}: a tuple of expressions of the sizes, e.g. ('dim', 'ratio(n, bags)')")
    for e in op.key:
        why = _unreadable(op, e, number=True, of_sizes=True)
        if why:
            fail(f"key {e!r}: an expression of the sizes ({', '.join(op.sizes)}) with + - * and ratio(a, b) ({why})")
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
