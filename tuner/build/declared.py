"""The C ABI header and the op's C++ of a family that declares its op (`OP_DECLARATION`, a
tuner.declare.Op), rendered from templates/common/declared_abi.h.j2 and declared_op.cpp.j2.

Both are rendered where they are needed: the header into each build of the family's variants and
of its binding, and into an export (tuner/build/render.py's `headers`), the op's C++ when the
binding builds (tuner/build/binding.py). To read them:

    python -m tuner.build.declared FAMILY [--op]
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import textwrap

import jinja2

from tuner import declare, expression, families
from tuner.errors import SpaceError

AT = {"float32": "at::kFloat", "float16": "at::kHalf", "bfloat16": "at::kBFloat16", "float64": "at::kDouble",
      "uint8": "at::kByte", "int8": "at::kChar", "int32": "at::kInt", "int64": "at::kLong"}


def declaration(family: str) -> declare.Op | None:
    return getattr(families.get(family), "OP_DECLARATION", None)


@functools.lru_cache(maxsize=None)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(families.templates_root() / "common")),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)


def _cpp(arg, user: bool = False) -> str:
    """An input's C++ parameter type in the op's kernels (`user`: in the op's own, where an
    optional tensor may be left out; one the variants may get as null is optional everywhere)."""
    if isinstance(arg, declare.Tensor):
        nullable = user and arg.optional or arg.optional == "null"
        return "const std::optional<at::Tensor>&" if nullable else "const at::Tensor&"
    return _scalar_cpp(arg)


def _scalar_cpp(s) -> str:
    """A scalar's C++ type in the op's kernels."""
    return f"std::optional<{declare.SCALAR_TYPES[s.type][0]}>" if s.optional else declare.SCALAR_TYPES[s.type][0]


def _prepared(op: declare.Op, t) -> str:
    """C++ of an input tensor as the variants get it: contiguous and aligned (a copy only where it is
    not), converted where it `converts`, undefined (a null pointer) where a nullable one is left out."""
    value = f"*{t.name}" if t.name in op.nullable else t.name
    if t.converts:
        value = f"{t.name}{'->' if t.name in op.nullable else '.'}to({AT[t.dtypes[0]]})"
    ready = f"ready({value}, {op.alignment})"
    return f"{t.name}.has_value() ? {ready} : at::Tensor()" if t.name in op.nullable else ready


PARSER = {"int": ("int64_t", "toInt64"), "float": ("double", "toDouble"), "bool": ("bool", "toBool"),
          "str": ("c10::string_view", "stringView")}  # a scalar's type in torch's PythonArgParser, its reader


def python_entry(op: declare.Op) -> tuple[str, list[str]]:
    """The op's Python signature as torch's PythonArgParser reads it (ATen's bindings' parser: the
    op's schema with C++ scalar types) and each input's C++ read from the parsed arguments `r`."""
    head, _, _ = op.schema().partition(" -> ")
    name, _, listed = head.partition("(")
    args, reads = [], []
    for i, (text, a) in enumerate(zip(listed.rstrip(")").split(", "), op.inputs)):
        kind, _, rest = text.partition(" ")
        optional = kind.endswith("?")
        if isinstance(a, declare.Tensor):
            args.append(text)
            reads.append(f"r.optionalTensor({i})" if optional else f"r.tensor({i})")
            continue
        cpp, reader = PARSER[kind.rstrip("?")]
        args.append(f"{cpp}{'?' if optional else ''} {rest}")
        reads.append(f"r.{reader}{'Optional' if optional else ''}({i})")
    return f"{name}({', '.join(args)})", reads


# A parameter's type in torch's PythonArgParser -> its C++ type and its reader of the parsed arguments.
# IntArrayRef is parsed as a Python object and read by `int_list` (the template's): torch's own reader
# formats its errors with fmt, which torch does not export to extensions.
FUNCTIONAL_TYPES = {
    "Tensor": ("at::Tensor", "tensor"), "Tensor?": ("std::optional<at::Tensor>", "optionalTensor"),
    "IntArrayRef": ("std::optional<std::vector<int64_t>>", "int_list"), "int64_t": ("int64_t", "toInt64"),
    "int64_t?": ("std::optional<int64_t>", "toInt64Optional"), "double": ("double", "toDouble"),
    "double?": ("std::optional<double>", "toDoubleOptional"), "bool": ("bool", "toBool"),
    "bool?": ("std::optional<bool>", "toBoolOptional"), "c10::string_view": ("c10::string_view", "stringView")}


def functional_entry(op: declare.Op) -> dict | None:
    """What the template renders of the op's Functional (tuner.declare_terms): the signature for
    torch's parser, each parameter's C++ read, and the condition a call must meet to go to the op:
    the declared one, each tensor handed to the op of a dtype it takes (an optional one: or
    None) on the first one's device, and each word handed to a scalar with choices among them
    (torch's function answers the rest: its deprecated words, its errors)."""
    f = op.functional
    if f is None:
        return None
    name, _, listed = f.signature.partition("(")
    params = [p for p in listed.rstrip(")").split(", ") if p != "*"]
    reads = []
    for i, text in enumerate(params):
        kind, _, rest = text.partition(" ")
        if kind not in FUNCTIONAL_TYPES:
            raise declare.DeclarationError(f"op {op.name!r}: functional parameter {text!r}: its type is none of "
                                           f"{', '.join(FUNCTIONAL_TYPES)}")
        cpp, reader = FUNCTIONAL_TYPES[kind]
        reads.append((cpp, rest.partition("=")[0], f"int_list(r.pyobject({i}))" if reader == "int_list"
                      else f"r.{reader}({i})"))
    if len(f.call) != len(op.inputs):
        raise declare.DeclarationError(f"op {op.name!r}: functional call gives {len(f.call)} arguments, "
                                       f"the op takes {len(op.inputs)}")
    kinds = {n: cpp for cpp, n, _ in reads}
    conditions = [f"({f.serves})"]
    first, given = f.call[0], dict(zip((a.name for a in op.inputs), f.call))
    for expr, a in zip(f.call, op.inputs):
        if isinstance(a, declare.Tensor) and expr in kinds:
            optional = kinds[expr] == "std::optional<at::Tensor>"
            to = "->" if optional else "."
            takes = (f"{expr}{to}scalar_type() == {given[a.like]}.scalar_type()" if a.like in given else
                     " || ".join(f"{expr}{to}scalar_type() == {AT[d]}" for d in op.root(a.name).dtypes))
            if expr != first:
                takes = f"({takes}) && {expr}{to}device() == {first}.device()"
            conditions.append(f"(!{expr}.has_value() || ({takes}))" if optional else f"({takes})")
        elif isinstance(a, declare.Scalar) and a.choices and kinds.get(expr) == "c10::string_view":
            conditions.append("(" + " || ".join(f'{expr} == "{c}"' for c in a.choices) + ")")
    parsed = f.signature.replace("IntArrayRef ", "PyObject* ")
    return {"name": name, "signature": json.dumps(parsed), "count": len(params), "reads": reads,
            "serves": " &&\n      ".join(conditions), "call": ", ".join(f.call)}


def _baseline_body(op: declare.Op) -> str | None:
    """The baseline's function body: its statements as declared, or a `return` of its expression."""
    if op.baseline is None:
        return None
    if ";" in op.baseline:
        return textwrap.indent(textwrap.dedent(op.baseline).strip("\n"), "  ")
    return f"  return {op.baseline};"


def context(op: declare.Op, family: str | None = None) -> dict:
    """What both templates read: names and C/C++ spellings made here, so that they stay plain.
    `family`: the family's name, which names its header, its variants' entry and the namespace of
    the op's control ops (the op's name where it is the family's)."""
    family = family or op.name
    out_type = "at::Tensor" if len(op.outputs) == 1 else f"std::tuple<{', '.join('at::Tensor' for _ in op.outputs)}>"
    grads = [f"grad_{o.name}" for o in op.outputs]
    bwd_params = ([("const at::Tensor&", g) for g in grads] + [(_cpp(t), t.name) for t in (*op.tensors, *op.saves)]
                  + [(_cpp(s), s.name) for s in op.scalars] + [("bool", f"{t.name}_grad") for t in op.differentiable])
    everything = [*op.outputs, *op.saves]
    fwd_type = out_type if not op.saves else f"std::tuple<{', '.join('at::Tensor' for _ in everything)}>"
    size_index = {n: i for i, n in enumerate(op.sizes)}
    call_args = ", ".join(a.name for a in op.inputs)

    def dim(n) -> str:  # one of a shape's sizes in C++: a size's value, or a number
        return f"int64_t{{{n}}}" if isinstance(n, int) else f"sizes[{size_index[n]}]"

    def shape(t) -> str:  # C++ of an output's or saved tensor's sizes (`sizes`: the size values, in order)
        if t.shape is None or isinstance(t.shape, str):  # like an input, or (an input's) another input's shape
            return f"{t.like if t.shape is None else t.shape}.sizes()"
        listed = ", ".join(dim(n) for n in t.shape)
        if t.reduced_by:  # a number unless the word is "none"
            return f'({t.reduced_by} == "none" ? std::vector<int64_t>{{{listed}}} : std::vector<int64_t>{{}})'
        return "{" + listed + "}"

    def options(t) -> str:
        return f"{t.like}.options()" if t.like else f"{op.tensors[0].name}.options().dtype({AT[t.dtypes[0]]})"

    def edge(t) -> str:  # a tensor's index among those autograd counts: the inputs given, before it
        before = op.tensors[:op.tensors.index(t)]
        given = " + ".join(f"({u.name}.has_value() ? 1 : 0)" for u in before if u.name in op.nullable)
        index = str(sum(u.name not in op.nullable for u in before)) + (f" + {given}" if given else "")
        return (f"{t.name}.has_value() && " if t.name in op.nullable else "") + f"ctx->needs_input_grad({index})"

    def word_is(t) -> str:  # C++: the call's word is one of those a saved tensor is written `when`
        scalar, wanted = t.when
        return "(" + " || ".join(f'{scalar} == "{w}"' for w in wanted) + ")"

    def pointer(t, forward: bool) -> str:  # an output's or saved tensor's address in a pass's args
        own = t.name if forward else f"{t.name}_"
        if forward and t.gradient_of:  # allocated where a backward will ask for it
            return f"{own}.defined() ? {own}.data_ptr() : nullptr"
        if t.when:  # at its words, where a backward follows
            return f"{'saving && ' if forward else ''}{word_is(t)} ? {own}.data_ptr() : nullptr"
        if t.only_if:
            return f"{own}.numel() && vt->{t.only_if} ? {own}.data_ptr() : nullptr" if forward else \
                f"vt->{t.only_if} ? {own}.data_ptr() : nullptr"
        return f"{own}.data_ptr()"

    def scalar_value(s) -> str:  # a scalar as the variants get it
        if s.type == "str":
            return f"{s.name}_index({s.name})"
        return f"static_cast<{declare.SCALAR_TYPES[s.type][1]}>({s.name}{'.value_or(0)' if s.optional else ''})"

    bwd_type = ("at::Tensor" if len(op.differentiable) == 1
                else f"std::tuple<{', '.join('at::Tensor' for _ in op.differentiable)}>")
    python_signature, python_reads = python_entry(op)
    return {
        "op": op, "name": op.name, "macro": op.name.upper(), "abi": op.abi,
        "python_signature": json.dumps(python_signature), "python_reads": python_reads,
        "functional": functional_entry(op),
        **op.structs,
        "c_scalar": {s.name: declare.SCALAR_TYPES[s.type][1] for s in op.scalars},
        "words": {s.name: "  // " + ", ".join(f"{i} {c}" for i, c in enumerate(s.choices)) if s.choices else ""
                  for s in op.scalars},
        "dtypes": {t.name: [AT[d] for d in t.dtypes] for t in op.tensors if t.like is None},
        "dtype_words": {t.name: " or ".join(t.dtypes) for t in op.tensors if t.like is None},
        "varying": [(t.name, len(t.dtypes)) for t in op.varying],
        "signature": ", ".join(f"{_cpp(a)} {a.name}" for a in op.inputs),
        "sig": f"{out_type}({', '.join(_cpp(a, user=True) for a in op.inputs)})",
        "user_signature": ", ".join(f"{_cpp(a, user=True)} {a.name}" for a in op.inputs),
        "optional": [a.name for a in op.tensors if a.optional is True], "nullable": op.nullable,
        "saved_inputs": ", ".join(f"{t.name}.value_or(at::Tensor())" if t.name in op.nullable else t.name
                                  for t in op.tensors),
        "unwrapped_args": ", ".join(f"*{a.name}" if isinstance(a, declare.Tensor) and a.optional is True else a.name
                                    for a in op.inputs),
        "call_args": call_args, "out_type": out_type,
        "fn_type": "at::Tensor" if len(op.outputs) == 1 else "variable_list",  # what an autograd Function returns
        "bwd_signature": ", ".join(f"{t} {n}" for t, n in bwd_params), "bwd_type": bwd_type,
        "bwd_sig": f"{bwd_type}({', '.join(t for t, _ in bwd_params)})",
        "bwd_call": ", ".join(n for _, n in bwd_params),
        "schema": json.dumps(op.schema()), "baseline_schema": json.dumps("baseline" + op.schema()[len(op.name):]),
        "bwd_schema": json.dumps(op.backward_schema()),  # C++ string literals
        "any_grad": " || ".join(f"{t.name}_grad" for t in op.differentiable), "first": op.tensors[0].name,
        "everything": everything, "fwd_type": fwd_type, "fwd_sig": f"{fwd_type}({', '.join(_cpp(a) for a in op.inputs)})",
        "fwd_schema": json.dumps(op.forward_schema()) if op.saves else None,
        "shape": {t.name: shape(t) for t in (*op.outputs, *op.saves, *op.tensors)
                  if (t.like or t.shape is not None) and t.shape is not Ellipsis},
        "shaped_inputs": [t for t in op.tensors if isinstance(t.shape, tuple)], "size_index": size_index,
        "dims": {t.name: [dim(n) for n in t.shape] for t in op.tensors if isinstance(t.shape, tuple)},
        "prepared": {t.name: _prepared(op, t) for t in op.tensors},
        "baseline_body": _baseline_body(op), "family": family,
        "cpp": {e: expression.cpp(e, {t.name for t in op.tensors}, op.may_be_none, {s.name: s.type for s in op.scalars})
                for e in (*op.sizes.values(), *(c[0] for c in op.checks), *(g[1] for g in op.guards))},  # sizes', checks', guards' C++
        "error_bit": {e[0]: i for i, e in enumerate(op.errors)},  # a guard's error's bit
        # a guard's ascending and allowed value, as guard_part takes them
        "guard_words": {g[0]: ("true" if g[3:] == ("ascending",) else "false") + ", "
                        + (f"std::optional<int64_t>({g[3]})" if g[3:] and g[3] != "ascending" else "std::nullopt")
                        for g in op.guards},
        "guarded_args": ", ".join(f"{a.name}_safe" if a.name in {g[0] for g in op.guards} else a.name for a in op.inputs),
        "key_cpp": [expression.cpp(e, set(), set(), {n: "int" for n in op.sizes}) for e in op.key],
        "key_call": f"key_of(sizes_of({call_args}))" if op.key else f"sizes_of({call_args})",
        "kind_call": f"{op.kind}_index({op.kind})" if op.kind else "0",  # a word's index among its choices
        "only_if": {t.name: t.only_if for t in op.saves if t.only_if},
        "when": {t.name: word_is(t) for t in op.saves if t.when},
        "forward_pointer": {t.name: pointer(t, True) for t in everything},
        "backward_pointer": {t.name: pointer(t, False) for t in op.saves},
        # the scalars' fields of both passes' args: a word's index, a number (0 and <name>_given where left out)
        "scalar_fields": "".join(f".{s.name} = {scalar_value(s)}, "
                                 + (f".{s.name}_given = {s.name}.has_value() ? 1 : 0, " if s.optional else "")
                                 for s in op.scalars),
        "edge": {t.name: edge(t) for t in op.differentiable},
        # a gradient the backward writes: wanted, of an input given
        "wants": {t.name: f"({t.name}_grad && {t.name}_.defined())" if t.name in op.nullable else f"{t.name}_grad"
                  for t in op.differentiable},
        "requires": {t.name: f"({t.name}.has_value() && {t.name}->requires_grad())" if t.name in op.nullable
                     else f"{t.name}.requires_grad()" for t in op.differentiable},
        "converts": [t.name for t in op.tensors if t.converts],
        "options": {t.name: options(t) for t in (*op.outputs, *op.saves)},
        "dtype_of": {t.name: f"{t.like}.scalar_type()" if t.like else AT[t.dtypes[0]] for t in op.outputs},
        "outputs_of_all": ("std::get<0>(all)" if len(op.outputs) == 1
                           else "{" + ", ".join(f"std::get<{i}>(all)" for i in range(len(op.outputs))) + "}"),
        "scalar_cpp": {s.name: _scalar_cpp(s) for s in op.scalars},
        "grad_saves": [t.name for t in op.saves if t.gradient_of],
        "saved_grad_of": {t.gradient_of: t.name for t in op.saves if t.gradient_of},
        # the checks that name no optional input: made also of a call that leaves one out
        "unconditional_checks": [c for c in op.checks if not set(re.findall(r"\w+", c[0]))
                                 & {t.name for t in op.tensors if t.optional is True}],
    }


def header(op: declare.Op, family: str | None = None) -> str:
    """The C ABI header: the argument structs and the variants' table."""
    return _environment().get_template("declared_abi.h.j2").render(**context(op, family))


def op_source(op: declare.Op, family: str | None = None) -> str:
    """The op's C++: schema, checks, the CUDA kernels of the op and its backward, the autograd."""
    return _environment().get_template("declared_op.cpp.j2").render(**context(op, family))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="print a declared family's C ABI header (or its op's C++), as rendered")
    ap.add_argument("family")
    ap.add_argument("--op", action="store_true", help="the op's C++ instead of the header")
    args = ap.parse_args(argv)
    try:
        op = declaration(args.family)
    except SpaceError as exc:  # an unknown family: one line, as every command says it
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if op is None:
        print(f"family {args.family!r} declares no op (OP_DECLARATION)", file=sys.stderr)
        return 2
    print(op_source(op, args.family) if args.op else header(op, args.family), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
