"""Search spaces: dimensions, hard constraints, enumeration and covering sets.

Constraints are hard and applied before anything is rendered or sampled:
Optuna's own constraints are soft, so invalid points never enter a study.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

from tuner import declare
from tuner.errors import DtypeError, ProblemError, SpaceError
from tuner.variant import Variant

_DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "float": "float32", "fp16": "float16", "half": "float16",
                  "f16": "float16", "bf16": "bfloat16", "u8": "uint8", "long": "int64", "int": "int32",
                  "i64": "int64", "i32": "int32"}
# bytes an element takes, without torch (spaces are made before it is imported)
_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
             "uint8": 1, "int8": 1, "bool": 1}


def dtype_name(name: str, among: Sequence[str] | None = None, what: str = "a") -> str:
    """A dtype's canonical name, as spaces and problems record it ('bf16' -> 'bfloat16'); with
    `among`, a SpaceError where it is not one of them (`what`: whose dtype, for the message)."""
    found = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if among is not None and found not in among:
        raise DtypeError(f"{what} dtype {found!r} is not one of {list(among)}")
    return found


def itemsize(name: str) -> int:
    """Bytes an element of the dtype `name` takes ('bf16' -> 2)."""
    return _ITEMSIZE[dtype_name(name)]


@dataclass(frozen=True)
class Dim:
    name: str
    values: tuple[Any, ...]
    help: str = ""


@dataclass(frozen=True)
class Constraint:
    description: str
    check: Callable[[Mapping[str, Any]], bool]


def with_defaults(dims, params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with None for each dimension that has None among its values and is left out (a
    choice that is off unless set: variants recorded before the dimension existed ran without it).
    The added keys come last, and None is not in names: the variant's name does not change."""
    return {**params, **{d.name: None for d in dims if None in d.values and d.name not in params}}


class Space:
    """The variants of one family for one problem (its fixed parameters, e.g. dtypes)."""

    def __init__(
        self,
        family: str,
        fixed: Mapping[str, Any],
        dims: Sequence[Dim],
        constraints: Sequence[Constraint] = (),
        flags: Mapping[str, Any] | None = None,
    ):
        self.family = family
        self.fixed = dict(fixed)
        self.flags = dict(flags or {})
        self.dims = list(dims)
        self.constraints = list(constraints)
        odd = [n for n in [*self.fixed, *self.flags, *(d.name for d in self.dims)] if not n.isidentifier()]
        if odd:  # templates read them as variables; a joined variant's backward keys have a colon
            raise SpaceError(f"{family}: parameter names must be identifiers, not {odd}")
        self._all: tuple[Variant, ...] | None = None  # every variant, made on the first walk (`__iter__`)

    def violations(self, params: Mapping[str, Any]) -> list[str]:
        """Reasons `params` is not a point of this space (empty when it is)."""
        problems = []
        for dim in self.dims:
            if dim.name not in params:
                problems.append(f"missing parameter {dim.name!r}")
            elif params[dim.name] not in dim.values:
                problems.append(f"{dim.name}={params[dim.name]!r} is not one of {list(dim.values)}")
        if problems:
            return problems
        return [c.description for c in self.constraints if not c.check(params)]

    def variant(self, **params: Any) -> Variant:
        """The variant for tuned parameter values, checked against dims and constraints. A dimension
        with None among its values (a choice that is off unless set, absent from names) may be left
        out: it is None, as for variants named before the dimension existed."""
        params = self._with_defaults(params)
        wrong = self.violations(params)
        if wrong:
            raise SpaceError(f"not a valid {self.family} variant: " + "; ".join(wrong))
        return self._variant(params)

    def _with_defaults(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return with_defaults(self.dims, params)

    def _variant(self, params: Mapping[str, Any]) -> Variant:
        # Order: problem (fixed), tuned dims, then flags; the name follows it.
        tuned = {d.name: params[d.name] for d in self.dims}
        return Variant.of(self.family, {**self.fixed, **tuned, **self.flags})

    def __iter__(self) -> Iterator[Variant]:
        # made once: a search walks its space at every ask and table (EmbeddingBag's: 7,296 variants,
        # each checked against the constraints and named)
        if self._all is None:
            names = [d.name for d in self.dims]
            points = (dict(zip(names, values)) for values in itertools.product(*(d.values for d in self.dims)))
            self._all = tuple(self._variant(p) for p in points if all(c.check(p) for c in self.constraints))
        return iter(self._all)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def by_name(self) -> dict[str, Variant]:
        """Every variant by its name (names read back from a study, a log or an export)."""
        return {v.name: v for v in self}

    def __contains__(self, variant: Variant) -> bool:
        params = variant.as_dict()
        if any(params.get(k) != v for k, v in {**self.fixed, **self.flags}.items()):
            return False
        return not self.violations(params)

    def nearest(self, params: Mapping[str, Any]) -> Variant:
        """The variant for `params`, or the valid one that differs from them in the fewest
        dimensions (a sampler may propose a point that a constraint excludes). A dimension with
        None among its values may be left out, as in `variant`."""
        params = self._with_defaults(params)
        if not self.violations(params):
            return self._variant(params)
        best, best_diff = None, None
        for variant in self:
            diff = sum(variant[d.name] != params.get(d.name) for d in self.dims)
            if best_diff is None or diff < best_diff:
                best, best_diff = variant, diff
        if best is None:
            raise SpaceError(f"the {self.family} space for {self.fixed} is empty")
        return best

    def tuned(self, variant: Variant) -> dict[str, Any]:
        """The tuned parameters of a variant (without the fixed problem ones)."""
        return {d.name: variant[d.name] for d in self.dims}


def covering(spaces: Sequence[Space]) -> list[Variant]:
    """A few variants that together use every value of every dimension, one or more per space.

    Greedy: each pick is the valid point that covers the most (dimension, value)
    pairs not yet covered. Used by the compile tests so that every code path of a
    template is built without building the whole space.
    """
    uncovered = {(d.name, v) for s in spaces for d in s.dims for v in d.values}
    used: dict[tuple[str, Any], int] = {}
    picks: list[Variant] = []
    pending = list(spaces)
    while pending or uncovered:
        extra = not pending  # every space has a pick; this one only adds coverage
        space = pending.pop(0) if pending else spaces[len(picks) % len(spaces)]
        best, best_score = None, None
        for variant in space:
            pairs = [(d.name, variant[d.name]) for d in space.dims]
            # Most new coverage first; among equals, the least used values, so that
            # picks beyond the cover still spread over the space.
            score = (sum(p in uncovered for p in pairs), -sum(used.get(p, 0) for p in pairs))
            if best_score is None or score > best_score:
                best, best_score = variant, score
        if best is None:
            raise SpaceError(f"the {space.family} space for {space.fixed} is empty")
        if extra and best_score[0] == 0:
            leftover = sorted(uncovered, key=str)
            raise SpaceError(f"no valid variant covers {leftover}")
        picks.append(best)
        for d in space.dims:
            pair = (d.name, best[d.name])
            uncovered.discard(pair)
            used[pair] = used.get(pair, 0) + 1
    return picks


SIZE_MAX = 2**31 - 1  # a problem's size, on its command line or in a capture file: a tensor dimension


def option(default, help: str, *, flag: str | None = None, choices: Sequence[str] | None = None,
           parse: str | None = None, dtype: bool = False):
    """A field of a family's Problem as the command line offers it (tuner.cli.target): `--<name>`
    with underscores as dashes, or `flag`; `help`; `choices`; `parse`, the name of a parser in
    tuner.cli.args ("size", "size_or_zero"; default: "size" for an int, the text as given
    otherwise); `dtype`, a dtype's name made canonical ('bf16' -> 'bfloat16'). The problem's
    space (`space_for`) then checks the values together."""
    return field(default=default, metadata={"option": {"help": help, "flag": flag, "choices": choices,
                                                       "parse": parse, "dtype": dtype}})


# The command line's parser (tuner.cli.args) of a scalar the problem holds, by its declared type
_SCALAR_PARSE = {"float": "real", "int": "whole", "bool": "boolean", "str": None}
_SCALAR_TYPE = {"float": float, "int": int, "bool": bool, "str": str}


def problem_class(op: declare.Op, family: str, defaults: Mapping[str, Any], helps: Mapping[str, str] | None = None,
                  *, scalars: Sequence[str] = (), fields: Mapping[str, Any] | None = None,
                  key: Callable[[Any], str] | None = None, sizes: Sequence[str] | None = None,
                  dtype_fields: Mapping[str, str] | None = None) -> type:
    """A declared family's Problem, from its op's declaration: a frozen dataclass with `family` and,
    each an `option` of the command line, an int field per size, a str field per varying tensor
    (its dtype), then a field per scalar named in `scalars` (the values a search checks and times
    at; a str scalar among its choices). Fields are named as the declaration names them, in its
    order (sizes, then tensors), then the `fields` that shape the inputs, the scalars in the order given.

    `defaults`: each size's and dtype's value, and a scalar's where its declared default will not
    do; `helps`: an option's help where the made one ("n: x.numel()", "x dtype") says too little.
    `fields`: more, each an `option(...)`: one named as a made field replaces it (a parser of its
    own), any other shapes the inputs alone (how GIoU's boxes are drawn, which make_inputs takes)
    and follows the dtypes.
    `sizes`: the declared sizes that are fields, where some only describe a call (EmbeddingBag's
    entries `n`); `dtype_fields`: a tensor's dtype field by another name ({"indices": "index"},
    as the op's spec names it).
    `key()` names the problem in studies and exports: each size as its initial, upper-cased, and
    its value, then the dtypes, the fields that shape the inputs and the scalars, a word as itself
    and a number after its name's initials ("R4096-V32000-bfloat16-mean-ls0.1"); `key(problem)`
    instead, where given."""
    def fail(message: str):
        raise declare.DeclarationError(f"{family}'s problem: {message}")

    helps, given = dict(helps or {}), dict(fields or {})
    declared = {s.name: s for s in op.scalars}
    unknown = [n for n in scalars if n not in declared]
    if unknown:
        fail(f"{unknown[0]!r} is no scalar of the op (one of {', '.join(declared) or 'none'})")
    if any(n not in op.sizes for n in sizes or ()):
        fail(f"{next(n for n in sizes if n not in op.sizes)!r} is no size of the op (one of {', '.join(op.sizes)})")
    sizes = {n: op.sizes[n] for n in (op.sizes if sizes is None else sizes)}
    tensors = {dict(dtype_fields or {}).get(t.name, t.name): t for t in op.varying}  # field -> tensor
    made_names = [*sizes, *tensors, *scalars]
    inputs = [n for n in given if n not in made_names]  # the fields that shape the inputs alone
    names = [*made_names, *inputs]
    stray = [n for n in [*defaults, *helps] if n not in names]
    if stray:  # a misspelt name would otherwise leave its field at a default unseen
        fail(f"{stray[0]!r} is no field of it (one of {', '.join(names)})")
    missing = [n for n in made_names
               if n not in given and defaults.get(n, getattr(declared.get(n), "default", None)) is None]
    if missing:
        fail(f"give defaults[{missing[0]!r}]: the value a search tunes for unless told")
    made: dict[str, tuple] = {}
    for n, expression in sizes.items():
        made[n] = (int, option(int(defaults[n]), helps.get(n, f"{n}: {expression}")))
    for n, t in tensors.items():
        dtype = dtype_name(defaults[n])
        if dtype not in t.dtypes:
            fail(f"{t.name}'s default dtype {dtype!r} is not one of its dtypes {list(t.dtypes)}")
        made[n] = (str, option(dtype, helps.get(n, f"{t.name} dtype"), dtype=True))
    scalar_fields = {}
    for n in scalars:
        s = declared[n]
        value = _SCALAR_TYPE[s.type](defaults.get(n, s.default))  # 0 -> 0.0: capture files are checked by type
        words = f"{n.replace('_', ' ')}: {', '.join(s.choices)}" if s.choices else n.replace("_", " ")
        scalar_fields[n] = (_SCALAR_TYPE[s.type], option(value, helps.get(n, words), choices=s.choices or None,
                                                         parse=_SCALAR_PARSE[s.type]))
    for n in inputs:
        made[n] = (type(given[n].default), given[n])
    made.update(scalar_fields)  # after the fields of the inputs
    made.update({n: (made[n][0], given[n]) for n in made_names if n in given})

    def made_key(problem) -> str:
        parts = [n[0].upper() + str(getattr(problem, n)) for n in sizes]
        parts += [getattr(problem, n) for n in tensors] + [str(getattr(problem, n)) for n in inputs]
        for n in scalars:  # a word says what it is; a number is named by its initials ("ls0.1")
            v = getattr(problem, n)
            if not isinstance(v, str):
                v = "".join(w[0] for w in n.split("_")) + (f"{v:g}" if isinstance(v, float) else str(int(v)))
            parts.append(v)
        return "-".join(parts)

    cls = dataclasses.make_dataclass("Problem", [("family", ClassVar[str], family)]
                                     + [(n, kind, f) for n, (kind, f) in made.items()],
                                     frozen=True, namespace={"key": key or made_key,
                                                             "dtype_fields": dict(dtype_fields or {}),
                                                             "__post_init__": _checked_fields})
    cls.__module__ = sys._getframe(1).f_globals["__name__"]  # the family's: pickle finds it there as Problem
    return cls


# The lowest value of an int field, by its command-line parser (tuner.cli.args; an int's default is
# "size"); "whole": an int64 scalar
_INT_LEAST = {"size": 1, "size_or_zero": 0, "whole": -2**63}


def _checked_fields(problem) -> None:
    """A Problem's fields as its command line would take them (`Problem(rows=-5)` in Python went on
    to fail later, or not at all): an int a whole number in its parser's range (a size from 1, or 0,
    to SIZE_MAX), a float finite (a fraction from 0 to 1), a bool a bool, a word a str among its
    choices; else ProblemError naming the field."""
    import math
    import operator

    for f in dataclasses.fields(problem):
        meta, value = f.metadata.get("option"), getattr(problem, f.name)
        if meta is None:
            continue
        kind, want = f.type if isinstance(f.type, type) else type(f.default), None
        if kind is bool:
            want = None if isinstance(value, bool) else "True or False"
        elif kind is int:
            least = _INT_LEAST.get(meta["parse"] or "size", -2**63)
            most = 2**63 - 1 if least < 0 else SIZE_MAX
            try:
                whole = None if isinstance(value, bool) else operator.index(value)
            except TypeError:
                whole = None
            want = None if whole is not None and least <= whole <= most else f"a whole number from {least} to {most}"
        elif kind is float:
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            if ok and meta["parse"] == "fraction":
                ok = 0 <= value <= 1
            want = None if ok else "a number from 0 to 1" if meta["parse"] == "fraction" else "a finite number"
        elif not isinstance(value, str):
            want = "a word"
        if want is None and meta["choices"] and value not in meta["choices"]:
            want = f"one of {', '.join(map(str, meta['choices']))}"
        if want is not None:
            raise ProblemError(f"{problem.family}'s problem: {f.name} must be {want}, got {value!r}")


def describe(problem_class: type, problem: Mapping[str, Any]) -> str:
    """A problem in a line, for listings (export-best, a search of captured problems): its dtypes
    joined by "/", then each other field of the family's Problem in its order, a word as itself and
    a number after its name ("bfloat16/uint8 batch=1024 slots=256 article mean")."""
    fields = [f for f in dataclasses.fields(problem_class) if f.name in problem]
    dtypes = [str(problem[f.name]) for f in fields if f.metadata.get("option", {}).get("dtype")]
    rest = []
    for f in fields:
        if not f.metadata.get("option", {}).get("dtype"):
            v = problem[f.name]
            rest.append(v if isinstance(v, str) else f"{f.name}={v:g}" if isinstance(v, float) else f"{f.name}={v}")
    return " ".join(filter(None, ["/".join(dtypes), *rest]))


def dtype_fields(family) -> dict[str, tuple[str, ...]]:
    """A family module's dtype fields (its `space_for`'s: "pred" -> its dtypes, ...), in order; none
    for a family of one space."""
    return dict(getattr(getattr(family, "space_for", None), "choices", {}))


def fixed_spaces(make: Callable[..., Space], **choices: Sequence[str]):
    """A family's `space_for(problem)`, `all_spaces()` and `covering_set()` from its
    `space(**fixed)` and the values each fixed field (a dtype, say) takes: a problem's fields
    pick its space, and every combination of values is one space. `space_for.choices` keeps the
    fields and their values, from which the command line makes its space options; `flags` go to
    `space()` as they are (the family's SPACE_FLAGS: opt-in kinds of variant)."""
    def space_for(problem: Mapping[str, Any], **flags: bool) -> Space:
        return make(**{k: problem[k] for k in choices if k in problem}, **flags)

    space_for.choices = choices  # type: ignore[attr-defined]

    def all_spaces(**flags: bool) -> list[Space]:
        return [make(**dict(zip(choices, combo)), **flags) for combo in itertools.product(*choices.values())]

    @functools.lru_cache(maxsize=1)
    def covered() -> tuple[Variant, ...]:
        return tuple(covering(all_spaces()))

    def covering_set() -> list[Variant]:
        """Every value of every dimension at least once, in every space (worked out once: RMSNorm's
        takes ~0.8 s)."""
        return list(covered())

    return space_for, all_spaces, covering_set


def kernel_arg(op: declare.Op, scalar: str):
    """A family's `KERNEL_ARGS` and `search_focus` where its kernels take a str scalar's word as their
    integer template argument (the word's index among the scalar's choices: GIoU's reduction,
    EmbeddingBag's mode): ptxas's kernel names read by the word, and a search that renders the
    kernels of its problem's word alone (`only`: a third of the compile where there are three; the
    same machine code for them). Exports render every word."""
    choices = op.choices(scalar)

    def search_focus(problem: Mapping[str, Any]) -> dict[str, Any]:
        return {"only": problem[scalar]}

    return {str(i): word for i, word in enumerate(choices)}, search_focus
