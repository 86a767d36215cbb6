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
import re
from dataclasses import dataclass, field

from .declare_terms import SCALAR_TYPES, DeclarationError, Functional, Scalar, Tensor  # noqa: F401 (the names a declaration uses)
from .declare_check import check


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
    # Libraries the variants call for part of their work ("cublas": their GEMMs on torch's cuBLAS):
    # both passes' args get `void* blas`, the handle of torch's current stream (the variant sets the
    # stream it is given on it); the variants' units link the library (tuner/build/libraries.py).
    libraries: tuple[str, ...] = ()
    # The shape key a winner is picked by, where it is not every size: expressions of the sizes by
    # name (("dim", "ratio(n, bags)"): a bag's mean length), and `kind`, a str scalar whose word a
    # call prefers its winner tuned at (a bag's mode; the problem then names it).
    key: tuple[str, ...] = ()
    kind: str | None = None
    # How many of the key's sizes, the last ones, are loose: they weigh in the choice among the tuned
    # problems and the shapes the export measured around them (tuner.deploy.regions, which measures
    # at more of them), but never put a call beyond a tuned problem's reach (EmbeddingBag's count of
    # bags: a variant tuned at 2,048 bags serves 50,000, unless the export measured torch's op faster there).
    loose: int = 0
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
    # Integer inputs torch's op (the baseline) must not see out of range: (input, bound, error), and
    # a fourth word, "ascending" or an int scalar's name, the bound an expression of the inputs as a
    # check's is. Where the baseline serves a CUDA call, one kernel checks each entry is in [0, bound)
    # (or the scalar's value: an ignore_index; and not below the one before it: "ascending") and
    # reports `error` as a validating variant does, and
    # torch's op gets a copy with entries outside clamped into range: a bad index never reaches
    # torch's device-side assert, which would end the process's CUDA context.
    guards: tuple = ()
    # torch's function the op stands in for, bound for Python at its own binding's cost
    # (tuner.functional's form of it): a Functional.
    functional: Functional | None = None

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

    def choices(self, scalar: str) -> tuple:
        """The words a str scalar takes (its declared `choices`), by the scalar's name."""
        return next(s.choices for s in self.scalars if s.name == scalar)

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


def _schema_value(v) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    return ("True" if v else "False") if isinstance(v, bool) else repr(v)
