"""scale_add's op, `torch.ops.tuner.scale_add(x, y, alpha)`: the reference on CPU, the exported
winner on CUDA (called through its C table; a toy, so from Python)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from tuner import build, gpus
from tuner.variant import Variant

from . import FAMILY, reference

_LIB = None
_launch = None  # the winner's C launcher once bound on a GPU


class _Vtable(ctypes.Structure):
    _fields_ = [("abi", ctypes.c_int), ("name", ctypes.c_char_p), ("launch", ctypes.c_void_p)]


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                           ctypes.c_longlong, ctypes.c_void_p)


def _register() -> None:
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("tuner", "FRAGMENT")
    _LIB.define("scale_add(Tensor x, Tensor y, float alpha) -> Tensor")

    def cpu(x, y, alpha):
        return reference(x, y, alpha)

    def cuda(x, y, alpha):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        rc = _launch(x.data_ptr(), y.data_ptr(), out.data_ptr(), alpha, x.numel(),
                     torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"scale_add: launch failed ({rc})")
        return out

    _LIB.impl("scale_add", cpu, "CPU")
    _LIB.impl("scale_add", cuda, "CUDA")


def load_op(directory: Path, manifest: dict, **options):
    global _launch
    if options:
        raise TypeError(f"scale_add takes no load options, got {sorted(options)}")
    _register()
    if torch.cuda.is_available():
        entry = manifest["entries"][0]
        variant = Variant.of(FAMILY, entry["params"])
        source = (directory / entry["source"]).read_text()
        (built,) = build.build([variant], gpus.attached().arch, sources={variant.name: source})
        lib = ctypes.CDLL(str(built.so))
        fn = getattr(lib, built.entry or "tuner_scale_add_vtable")
        fn.restype = ctypes.POINTER(_Vtable)
        _launch = _LAUNCH(fn().contents.launch)
        globals()["_keep"] = lib
    return torch.ops.tuner.scale_add


def set_validate(mode: str) -> None:
    pass  # nothing to validate


def check_errors() -> None:
    pass
