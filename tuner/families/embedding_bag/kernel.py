"""A built EmbeddingBag variant loaded into this process and called through its C table."""

from __future__ import annotations

import ctypes
from pathlib import Path

from tuner.errors import BuildError, KernelInputError

_ABI = 1
MODE_CODES = {"sum": 0, "mean": 1, "max": 2}
BAD_INDEX, BAD_OFFSET = 1, 2


class _Args(ctypes.Structure):
    # Mirrors TunerEmbeddingBagArgs in templates/embedding_bag/embedding_bag_abi.h.
    _fields_ = [
        ("weight", ctypes.c_void_p), ("indices", ctypes.c_void_p), ("offsets", ctypes.c_void_p),
        ("per_sample_weights", ctypes.c_void_p), ("out", ctypes.c_void_p), ("max_indices", ctypes.c_void_p),
        ("rows", ctypes.c_longlong), ("dim", ctypes.c_longlong), ("bags", ctypes.c_longlong),
        ("n", ctypes.c_longlong), ("mode", ctypes.c_int), ("padding_idx", ctypes.c_longlong),
        ("error_word", ctypes.c_void_p), ("error_flags", ctypes.c_void_p),
    ]


_FORWARD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Args), ctypes.c_void_p)


class _Vtable(ctypes.Structure):
    _fields_ = [("abi", ctypes.c_int), ("name", ctypes.c_char_p), ("weight_dtype", ctypes.c_char_p),
                ("index_dtype", ctypes.c_char_p), ("vec", ctypes.c_int), ("validates", ctypes.c_int),
                ("forward", _FORWARD)]


def error_text(bits: int) -> str:
    parts = []
    if bits & BAD_INDEX:
        parts.append("an index is outside [0, num_embeddings)")
    if bits & BAD_OFFSET:
        parts.append("offsets decrease or fall outside [0, len(indices)]")
    return "; ".join(parts)


class EmbeddingBagKernel:
    """The forward of one compiled variant, on the current CUDA stream. Errors the variant's
    validation finds stay in a device word until `take_errors()` (the search's calls never sync)."""

    def __init__(self, so: Path, expected_name: str | None = None):
        import torch

        self.path = Path(so)
        self._lib = ctypes.CDLL(str(self.path))  # kept alive: the table points into it
        fn = self._lib.tuner_embedding_bag_vtable
        fn.restype = ctypes.POINTER(_Vtable)
        table = fn().contents
        self.name = table.name.decode()
        if table.abi != _ABI:
            raise BuildError(self.name, f"{so} has ABI {table.abi}, expected {_ABI}; rebuild it")
        if expected_name is not None and self.name != expected_name:
            raise BuildError(expected_name, f"{so} holds variant {self.name}, not {expected_name}")
        self.vec = table.vec
        self.validates = bool(table.validates)
        self._forward = table.forward
        self._error = torch.zeros(1, dtype=torch.int32, device="cuda")

    def forward(self, weight, indices, offsets=None, mode: str = "mean", per_sample_weights=None,
                include_last_offset: bool = False, padding_idx: int | None = None, out=None, max_indices=None):
        """(out [bags, dim], max_indices or None), as torch.nn.functional.embedding_bag computes."""
        call, out, max_indices = self.prepare(weight, indices, offsets, mode, per_sample_weights,
                                              include_last_offset, padding_idx, out, max_indices)
        call()
        return out, max_indices

    def prepare(self, weight, indices, offsets=None, mode: str = "mean", per_sample_weights=None,
                include_last_offset: bool = False, padding_idx: int | None = None, out=None, max_indices=None):
        """(call, out, max_indices): `call()` launches the forward on these tensors and the current
        stream with nothing else done in Python, as the search times it."""
        import torch

        weight = weight.contiguous()
        if indices.dim() == 2:
            bags, per = indices.shape
            offsets = torch.arange(0, bags * per + 1, max(per, 1), device=indices.device,
                                   dtype=indices.dtype)[: bags + 1]
            indices = indices.reshape(-1)
        elif not include_last_offset:
            offsets = torch.cat([offsets, offsets.new_tensor([indices.numel()])])
        indices, offsets = indices.contiguous(), offsets.to(indices.dtype).contiguous()
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.contiguous()
        bags = offsets.numel() - 1
        if out is None:
            out = torch.empty(bags, weight.shape[1], dtype=weight.dtype, device=weight.device)
        if mode == "max" and max_indices is None:
            max_indices = torch.empty(bags, weight.shape[1], dtype=torch.int64, device=weight.device)
        a = _Args(weight.data_ptr(), indices.data_ptr(), offsets.data_ptr(),
                  per_sample_weights.data_ptr() if per_sample_weights is not None else None,
                  out.data_ptr(), max_indices.data_ptr() if mode == "max" else None,
                  weight.shape[0], weight.shape[1], bags, indices.numel(), MODE_CODES[mode],
                  -1 if padding_idx is None else padding_idx, self._error.data_ptr(), None)
        keep = (weight, indices, offsets, per_sample_weights, out, max_indices)  # alive while `call` is
        stream, ref, forward, name = torch.cuda.current_stream().cuda_stream, ctypes.byref(a), self._forward, self.name

        def call():
            rc = forward(ref, stream)
            if rc:
                raise RuntimeError(f"{name}: launch failed (CUDA error {rc})")
            return keep

        return call, out, (max_indices if mode == "max" else None)

    def take_errors(self) -> int:
        bits = int(self._error.item())
        self._error.zero_()
        return bits

    def check_errors(self) -> None:
        bits = self.take_errors()
        if bits:
            raise KernelInputError(f"embedding_bag: invalid input: {error_text(bits)}")
