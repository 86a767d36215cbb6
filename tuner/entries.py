"""How Python calls a bound op (tuner.runtime binds it; copied into wheels beside it): the
binding's own Python function of the op (`entry`), and a family's functions with torch's
signatures (`functional`: tuner.functional's), which the binding offers in C++ where the op's
declaration has a Functional. torch alone."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Callable

_entries: dict[str, Callable] = {}  # op -> its binding's own Python function (`python_entry`)
_compiling: Callable[[], bool] = bool  # torch.compiler.is_dynamo_compiling once an op is bound (looked up once):
# dynamo reads it as True where it traces (what cannot trace a C function); one Python call where
# is_compiling makes two (make_fx and export's tracing take the C functions: they dispatch the op)
_python_forms: dict[str, Callable] = {}  # op -> its family's Python function with torch's signature
_functionals: dict[str, Callable] = {}  # op -> that function as its binding offers it (`functional_entry`)
_loaded: dict[str, object] = {}  # op -> what tuner.load returns (`loaded`): one object, however often loaded


def bind(binding: Path, op: str) -> None:
    """The entries of an op whose binding has just been loaded."""
    import torch

    global _compiling
    _entries[op], _compiling = python_entry(binding, op), torch.compiler.is_dynamo_compiling
    fast = _functionals.get(op) or functional_entry(binding, op)  # made once: the C++ keeps its first
    if fast is not None:
        _functionals[op] = fast


def _library(binding: Path):
    import torch

    path = {Path(p).name: p for p in torch.ops.loaded_libraries}.get(Path(binding).name, str(binding))
    return ctypes.PyDLL(path)


def loaded(op: str):
    """`torch.ops.tuner.<op>` as tuner.load returns it: the packet in all but its call (its overloads
    and schemas; opcheck and torch.compile take it as the op, and a graph records it so), whose
    calls go to the binding's own entry (`python_entry`) instead of the packet's generic parsing,
    3-17 µs of a small call. The packet itself where the binding has no entry."""
    import torch

    packet = getattr(torch.ops.tuner, op)
    if _entries.get(op, packet) is packet:
        return packet
    if op not in _loaded:
        fast = object.__new__(_loaded_type())
        fast.__dict__.update(packet.__dict__)
        fast._tuner_op = op
        _loaded[op] = fast
    return _loaded[op]


@functools.cache
def _loaded_type() -> type:
    import torch

    class LoadedOp(torch._ops.OpOverloadPacket):
        """torch.ops.tuner.<op>, called through its binding's entry (`loaded`)."""

        def __call__(self, /, *args, **kwargs):
            # `entry`'s choice written out here: a frame less on every call of the op
            found = _entries.get(self._tuner_op)
            if found is not None and not _compiling():
                return found(*args, **kwargs)
            return self._op(*args, **kwargs)  # the packet's own call: what torch.compile traces

    LoadedOp.__module__ = __name__
    return LoadedOp


def python_entry(binding: Path, op: str) -> Callable:
    """The op as its binding offers it to Python (`tuner_python_<op>`, templates/common/declared_op.cpp.j2):
    torch's argument parser and the dispatcher, as ATen's functions are called, without the
    `torch.ops` packet's generic parsing (a few µs a call); the packet where the binding has none."""
    import torch

    packet = getattr(torch.ops.tuner, op)
    try:
        make = getattr(_library(binding), f"tuner_python_{op}")
    except (OSError, AttributeError):  # a binding without its own entry (a hand-written op)
        return packet
    make.restype, make.argtypes = ctypes.py_object, [ctypes.py_object]
    return make(packet)


def functional_entry(binding: Path, op: str) -> Callable | None:
    """The family's Python function with torch's signature (`functional`) as the op's binding
    offers it (`tuner_functional_<op>`, from the declaration's Functional): torch's argument parser
    and the checks in C++, the Python function for every call they do not send to the op. None
    where either is missing."""
    slow = _python_forms.get(op)
    if slow is None:
        return None
    try:
        make = getattr(_library(binding), f"tuner_functional_{op}")
    except (OSError, AttributeError):  # a binding rendered before its op declared one
        return None
    make.restype, make.argtypes = ctypes.py_object, [ctypes.py_object]
    return make(slow)


def functional(op: str) -> Callable[[Callable], Callable]:
    """A family's function with torch's signature on its op (tuner.functional's, e.g. rms_norm), from
    its Python form (`slow`, which decides every call: the op or torch's function): once an export
    is bound, calls go to the binding's C++ form of it (the same decision before Python runs a
    line; torch's call cost where torch serves), and to `slow` before that and under torch.compile
    (which traces what it calls)."""
    def wrap(slow: Callable) -> Callable:
        _python_forms[op] = slow

        @functools.wraps(slow)
        def call(*args, **kwargs):
            fast = _functionals.get(op)
            if fast is None or _compiling():
                return slow(*args, **kwargs)
            return fast(*args, **kwargs)
        return call
    return wrap


def entry(op: str) -> Callable:
    """The function Python code calls the loaded op through (tuner.functional does): the binding's
    own (`python_entry`), or `torch.ops.tuner.<op>` where none is bound or torch.compile traces the
    caller (the packet is what a graph records)."""
    found = _entries.get(op)
    if found is not None and not _compiling():
        return found
    import torch

    return getattr(torch.ops.tuner, op)
