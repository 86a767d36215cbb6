"""The terms of a declaration (tuner.declare): an op's tensors and scalars, the dtypes and scalar
types it may name, and the error a declaration that does not hold raises."""

from __future__ import annotations

import re
from dataclasses import dataclass

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
class Functional:
    """torch's function the op stands in for (F.rms_norm), called from Python at the cost of torch's
    own binding: the binding parses a call with `signature` (torch's PythonArgParser's, as ATen's
    bindings write it: "rms_norm(Tensor input, IntArrayRef normalized_shape, Tensor? weight=None,
    double? eps=None)"), and where `serves` holds (C++ of those parameters) and every tensor `call`
    hands the op is of a dtype the op takes, calls the op with `call` (C++ of the parameters, one
    per input of the op); any other call, one the parser refuses, and one that torch function
    handling must see, goes to the family's Python function (`runtime.functional(op)`), which
    decides in full. Types: tuner.build.declared.FUNCTIONAL_TYPES (an IntArrayRef is read as
    std::optional<std::vector<int64_t>>, nullopt for anything but a list of Python ints)."""

    signature: str
    serves: str
    call: tuple[str, ...]
