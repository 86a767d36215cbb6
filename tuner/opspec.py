"""A declared op's Python side (torch alone: exported wheels carry this file and declare.py): the
runtime's `OpSpec` made from the declaration, with the op's CPU kernels (the family's float64
reference, or its torch op outside the variants' dtypes) and fake kernels (torch.compile), the
sizes and checks the C++ makes, in Python, with the same messages, and what its guards refuse.

    OP = opspec.spec(OP_DECLARATION, FAMILY, reference=reference, torch_op=torch_fn, reach=math.log(4))

`reference(*inputs)` gives the outputs in float64 from the op's inputs (tensors as given, in any
dtype); the backward's reference is its gradient, by autograd in float64. `torch_op(*inputs)` is
what the op replaces (the declaration's `baseline`, in Python)."""

from __future__ import annotations

import functools
from typing import Callable

from . import declare, runtime


def leading(t) -> int:
    """The product of a tensor's sizes but the last (its rows, for an op over the last dimension)."""
    n = 1
    for s in tuple(t.shape)[:-1]:
        n *= int(s)
    return n


def ratio(a: int, b: int) -> int:
    """a // b of two sizes, 0 where b is 0 (C++'s `ratio`, tuner_op.h)."""
    return int(a) // max(int(b), 1)


@functools.cache
def code(expression: str):
    """A declaration's expression compiled once (a call's checks and sizes read several)."""
    return compile(expression, "<declaration>", "eval")


def _eval(expression: str, values: dict):
    """A size, check or key of the declaration, read in Python as written (tuner/expression.py
    renders the same text to the op's C++)."""
    return eval(code(expression), {"__builtins__": {}}, {**values, "leading": leading, "ratio": ratio})  # noqa: S307 (the family's own text)


def bind(op: declare.Op, args: tuple, kwargs: dict | None = None) -> dict:
    """name -> value of a call's inputs, scalars' defaults filled in."""
    values = dict(zip((a.name for a in op.inputs), args))
    values.update(kwargs or {})
    for a in op.scalars:
        values.setdefault(a.name, a.default)
    for a in op.tensors:
        values.setdefault(a.name, None)
    return values


def sizes(op: declare.Op, values: dict) -> list[int]:
    """The sizes the variants are given and a winner is picked by, in declared order."""
    return [int(_eval(e, values)) for e in op.sizes.values()]


def _dtype(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def _integer(t) -> bool:
    """An integer tensor (what an input that `converts` takes): not floating, complex or bool."""
    return not (t.dtype.is_floating_point or t.dtype.is_complex or _dtype(t) == "bool")


def check(op: declare.Op, values: dict, dtypes: bool = True) -> None:
    """The C++ checks and messages (declared_op.cpp.j2's check_shapes, check_dtypes), in Python."""
    name, present = op.name, {t.name: values[t.name] for t in op.tensors if values[t.name] is not None}
    for s in op.scalars:
        if s.choices and values[s.name] not in s.choices:
            raise ValueError(f"{name}: {s.name} must be one of {', '.join(s.choices)}, got {values[s.name]}")
    sized = op.sized_checks
    for condition, message in op.checks:
        if (condition, message) not in sized and not _eval(condition, values):
            raise ValueError(f"{name}: {message}")
    first = op.tensors[0].name
    for t in op.tensors:
        v = present.get(t.name)
        if v is None:
            continue
        other = t.shape if isinstance(t.shape, str) else t.like if t.shape is None else None
        if other is not None and tuple(v.shape) != tuple(present[other].shape):
            raise ValueError(f"{name}: {t.name} must have {other}'s shape {list(present[other].shape)}, "
                             f"got {list(v.shape)}")
        if t.name != first and v.device != present[first].device:
            raise ValueError(f"{name}: {first} is on {present[first].device} but {t.name} is on {v.device}")
    for t in op.tensors:
        if t.converts and t.name in present and not _integer(present[t.name]):
            raise TypeError(f"{name}: {t.name} must be an integer tensor, got {present[t.name].dtype}")  # as C++ says it
    for condition, message in sized:  # as the C++ makes them: once the shapes are concrete
        if not _eval(condition, values):
            raise ValueError(f"{name}: {message}")
    shaped = [t for t in op.tensors if isinstance(t.shape, tuple) and t.name in present]
    if shaped:
        known = sizes(op, values)
        for t in shaped:
            want = _shape(op, t, values, known)
            if list(present[t.name].shape) != want:
                raise ValueError(f"{name}: {t.name} must have shape {want} ({', '.join(map(str, t.shape))}), "
                                 f"got {list(present[t.name].shape)}")
    if not dtypes:
        return
    for t in op.tensors:
        v = present.get(t.name)
        if v is None:
            continue
        if t.like is None and not t.converts and _dtype(v) not in t.dtypes:  # the dtypes given as C++ names them
            raise TypeError(f"{name}: {t.name} must be {' or '.join(t.dtypes)}, got {v.dtype}")
        if t.like is not None and v.dtype != present[t.like].dtype:
            raise TypeError(f"{name}: {t.name} must have {t.like}'s dtype, {present[t.like].dtype}, got {v.dtype}")


def refuse(op: declare.Op, values: dict) -> None:
    """KernelInputError where an entry of a guarded input is outside its declared range (the
    declaration's `guards`: [0, bound), or the scalar's value too, or not below the entry before it
    where "ascending"), with the message a validating kernel reports it by: the CPU op refuses
    what the CUDA op refuses, from the same words."""
    errors = dict(op.errors)
    for name, bound, error, *rule in op.guards:
        t = values[name]
        if t is None or not t.numel():
            continue
        flat = t.reshape(-1)
        bad = (flat < 0) | (flat >= int(_eval(bound, values)))
        if rule and rule[0] != "ascending":
            bad &= flat != values[rule[0]]
        if bool(bad.any()) or (rule == ["ascending"] and bool((flat[1:] < flat[:-1]).any())):
            raise runtime.KernelInputError(f"{op.name}: invalid input: {errors[error]}")


def outside(op: declare.Op, values: dict) -> bool:
    """A call the variants do not take (a dtype outside theirs, an optional input left out that
    they cannot get as null): the baseline's."""
    for t in op.tensors:
        v = values[t.name]
        if v is None:
            if t.optional == "null":
                continue
            return True
        if t.converts:  # any integer dtype (another is refused)
            continue
        if (_dtype(v) not in t.dtypes) if t.like is None else v.dtype != values[t.like].dtype:
            return True
    return False


def _shape(op: declare.Op, t, values: dict, known: list[int] | None = None) -> list[int]:
    if t.shape is None or isinstance(t.shape, str):  # like an input, or another input's shape
        return list(values[t.like if t.shape is None else t.shape].shape)
    if t.reduced_by is not None and values[t.reduced_by] != "none":
        return []
    by_name = dict(zip(op.sizes, sizes(op, values) if known is None else known))
    return [n if isinstance(n, int) else by_name[n] for n in t.shape]


def empty(op: declare.Op, t, values: dict, known: list[int] | None = None):
    """An output or saved tensor of a call, uninitialized, of its declared shape and dtype
    (`known`: the call's sizes, where the caller has them)."""
    return _like(op, t, values).new_empty(_shape(op, t, values, known), dtype=dtype(op, t, values))


def _like(op: declare.Op, t, values: dict):
    return values[t.like] if t.like is not None else values[op.tensors[0].name]


def dtype(op: declare.Op, t, values: dict):
    """An output's or saved tensor's dtype in a call: its `like`'s, or its one declared."""
    import torch

    return values[t.like].dtype if t.like is not None else getattr(torch, t.dtypes[0])


def poison(t):
    """A tensor filled with what no kernel writes by chance: NaN, or -1 in an integer one."""
    return t.fill_(float("nan") if t.is_floating_point() else -1)


def kept(t, values: dict) -> bool:
    """Whether a saved tensor declared `when` a scalar has one of some words is written at this call's."""
    return t.when is None or values[t.when[0]] in t.when[1]


def nothing(op: declare.Op, t, values: dict):
    """A saved tensor's room where the forward does not write it: [0], of its dtype."""
    return _like(op, t, values).new_empty((0,), dtype=dtype(op, t, values))


def _outputs(op: declare.Op, reference: Callable, values: dict) -> list:
    """The reference's outputs, each in its dtype."""
    got = reference(*(values[a.name] for a in op.inputs))
    got = got if isinstance(got, (tuple, list)) else (got,)
    return [g.to(dtype(op, o, values)).reshape(_shape(op, o, values)) for o, g in zip(op.outputs, got)]


def _one(outs: list):
    return outs[0] if len(outs) == 1 else tuple(outs)


def gradients(op: declare.Op, reference: Callable, values: dict, grads: list, wanted: dict) -> list:
    """The reference's gradients of the differentiable inputs (float64, by autograd), for the
    outputs' gradients `grads`; None where not `wanted` or the input is left out."""
    return _both(op, reference, values, grads, wanted)[1]


def _both(op: declare.Op, reference: Callable, values: dict, grads: list, wanted: dict) -> tuple[list, list]:
    """(the reference's outputs, `gradients`) of one pass of it."""
    import torch

    with torch.enable_grad():
        inputs64 = {}
        for a in op.inputs:
            v = values[a.name]
            if isinstance(a, declare.Tensor) and a.grad and v is not None:
                v = v.detach().double().requires_grad_()
            inputs64[a.name] = v
        outs = reference(*(inputs64[a.name] for a in op.inputs))
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        # of a sum: autograd's check of a grad_outputs tensor imports sympy (seconds of a first call)
        total = sum((o * g.double().expand(o.shape)).sum() for o, g in zip(outs, grads))
        leaves = {t.name: inputs64[t.name] for t in op.differentiable if inputs64[t.name] is not None}
        got = dict(zip(leaves, torch.autograd.grad(total, list(leaves.values()), allow_unused=True)))
    return [o.detach() for o in outs], [None if not wanted[t.name] or t.name not in leaves else
                                        torch.zeros_like(leaves[t.name]) if got[t.name] is None else got[t.name]
                                        for t in op.differentiable]


def reference_gradients(op: declare.Op, reference: Callable, args: tuple, grads) -> tuple:
    """The float64 gradients of every differentiable input of `reference(*args)` for the output
    gradient(s) `grads`: what a variant's backward is checked against."""
    return reference_answers(op, reference, args, grads)[1]


def reference_answers(op: declare.Op, reference: Callable, args: tuple, grads) -> tuple[list, tuple]:
    """(the float64 outputs of `reference(*args)`, `reference_gradients`), from one pass of the
    reference: what a variant's forward and backward are checked against."""
    grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
    outs, got = _both(op, reference, bind(op, args), grads, {t.name: True for t in op.differentiable})
    return outs, tuple(got)


def impls(op: declare.Op, reference: Callable, torch_op: Callable | None, namespace: str = "") -> dict:
    """The CPU and fake kernels of the op, of `<op>_forward` where it saves tensors, and of
    `<op>_backward`, as tuner.runtime registers them (`namespace`: the op's control ops')."""
    n_out = len(op.outputs)

    def saved(values: dict) -> list:
        """The forward's saved tensors, uninitialized; one only some variants write (`only_if`) has
        room only where a winner of the call's dtype pair writes it, one written at some words alone
        (`when`) only at those (the C++ forward's rules)."""
        import torch

        found = []
        for t in op.saves:
            keeps = kept(t, values) and (t.only_if is None or getattr(getattr(torch.ops, namespace), f"keeps_{t.name}")(
                *(values[v.name].dtype for v in op.varying)))
            found.append(empty(op, t, values) if keeps else nothing(op, t, values))
        return found

    def user_cpu(*args, **kwargs):
        values = bind(op, args, kwargs)
        check(op, values, dtypes=False)
        if outside(op, values) and torch_op is not None:  # below autograd (inference mode): torch's
            return torch_op(*args, **kwargs)
        check(op, values)
        refuse(op, values)
        return _one(_outputs(op, reference, values))

    def user_fake(*args, **kwargs):
        values = bind(op, args, kwargs)
        check(op, values, dtypes=False)
        if not outside(op, values):
            check(op, values)
        return _one([empty(op, o, values) for o in op.outputs])

    def forward_cpu(*args):
        values = bind(op, args)
        check(op, values)
        refuse(op, values)
        kept = [poison(s) for s in saved(values)]  # the variants' own: the CPU
        return (*_outputs(op, reference, values), *kept)  # backward recomputes from the inputs

    def forward_fake(*args):
        values = bind(op, args)
        check(op, values)
        return (*(empty(op, t, values) for t in op.outputs), *saved(values))

    def backward_values(args):
        grads, rest = list(args[:n_out]), args[n_out:]
        names = [t.name for t in (*op.tensors, *op.saves)] + [s.name for s in op.scalars]
        values = dict(zip(names, rest))
        wanted = {t.name: bool(w) for t, w in zip(op.differentiable, rest[len(names):])}
        check(op, values)
        return grads, values, wanted

    def none(values: dict, t):  # a gradient not wanted, or of an input left out: empty, as the C++ gives it
        return (values[t.name] if values[t.name] is not None else values[op.tensors[0].name]).new_empty(0)

    def backward_cpu(*args):
        grads, values, wanted = backward_values(args)
        got = gradients(op, reference, values, grads, wanted)
        return _one([g.to(values[t.name].dtype) if g is not None else none(values, t)
                     for t, g in zip(op.differentiable, got)])

    def backward_fake(*args):
        grads, values, wanted = backward_values(args)
        return _one([values[t.name].new_empty(values[t.name].shape) if wanted[t.name] and values[t.name] is not None
                     else none(values, t) for t in op.differentiable])

    found = {op.name: (user_cpu, user_fake), f"{op.name}_backward": (backward_cpu, backward_fake)}
    if op.saves:
        found[f"{op.name}_forward"] = (forward_cpu, forward_fake)
    return found


def problem(op: declare.Op, values: dict, fields=()) -> dict | None:
    """The problem a call of the op poses (its sizes, each varying tensor's dtype, and the scalars
    among `fields`), or None for one the variants do not serve: refused, outside their dtypes, or
    empty (tuner.capture records calls by it)."""
    try:
        check(op, values)
    except (ValueError, TypeError, IndexError, RuntimeError):
        return None
    if outside(op, values) or any(values[t.name] is not None and values[t.name].numel() == 0 for t in op.tensors):
        return None
    found = dict(zip(op.sizes, sizes(op, values)))
    found.update({t.name: _dtype(values[t.name]) for t in op.varying})
    cast = {"float": float, "int": int, "bool": bool, "str": str}
    found.update({s.name: None if values[s.name] is None else cast[s.type](values[s.name])
                  for s in op.scalars if s.name in fields})
    return found


def shape_key(op: declare.Op, problem: dict) -> tuple[list[int], int]:
    """(the sizes a winner is picked by, its kind) of a problem: its declared `key` of the sizes (all
    of them where it declares none), and the index of its `kind` word (0 where none is declared)."""
    sizes = {n: int(problem[n]) for n in op.sizes if n in problem or not op.key}  # a key may read some alone
    key = [int(_eval(e, sizes)) for e in op.key] if op.key else list(sizes.values())
    if op.kind is None:
        return key, 0
    if op.kind not in problem:
        raise KeyError(f"{op.name}: a problem names its {op.kind} (its winners are kept by it): give the family's "
                       f"problem_class scalars=({op.kind!r},)")
    return key, op.choices(op.kind).index(problem[op.kind])


def pair(op: declare.Op, problem: dict, fields: dict | None = None) -> int:
    """A problem's dtype pair as the C++ numbers it: mixed radix over the tensors whose dtypes vary
    (a problem names each tensor's dtype by the tensor's name, or as `fields` says: {"indices": "index"})."""
    index = 0
    for t in op.varying:
        index = index * len(t.dtypes) + t.dtypes.index(problem[(fields or {}).get(t.name, t.name)])
    return index


def spec(op: declare.Op, family: str, reference: Callable, torch_op: Callable | None = None, reach: float = 0.0,
         extras: dict | None = None, untuned_by_baseline: bool = True, dtype_fields: dict | None = None,
         unfused: Callable[[dict], bool] | None = None) -> runtime.OpSpec:
    """The runtime's OpSpec of a declared op: a winner's problem names its sizes as the
    declaration does (`rows`, `width`; those its `key` reads, where it declares one), and each
    varying tensor's dtype by the tensor's name, or by the field `dtype_fields` names for it.
    `untuned_by_baseline=False`: a dtype pair no search tuned runs the tuned parameters nearest it
    (rendered for its dtypes) instead of the baseline. `unfused(problem)`: torch's op has no fused
    kernel for the problem's dtypes: variants serve that pair at every shape, tuned or not."""
    return runtime.OpSpec(
        family=family, op=op.name, namespace=f"tuner_{family}", abi=op.abi,
        impls=impls(op, reference, torch_op, f"tuner_{family}"),
        shape=lambda problem: shape_key(op, problem), extras=dict(extras or {}),
        baseline=op.baseline is not None, reach=reach, pair=lambda problem: pair(op, problem, dtype_fields),
        reference=reference, torch_op=torch_op, untuned_by_baseline=untuned_by_baseline, unfused=unfused)
