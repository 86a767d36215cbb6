"""A built variant loaded into this process and called directly: its C table found in the
library (ctypes) and checked (the family's C ABI, the variant's name), its functions called
with an argument struct of the tensors' pointers on torch's current stream (of the current
device, where the tensors must be: a search's worker has one GPU).

No torch binding is involved: a search checks and times variants as soon as the first one is
compiled, while the family's binding (a minute of C++ the first time) builds in the background
for the export (tuner/build/binding.py). The table and the argument structs are read from the
family's C ABI header (tuner/measure/abi.py): each plain field of the table is an attribute of the
kernel, each function `<name>_fn`."""

from __future__ import annotations

import ctypes
from pathlib import Path

from tuner import families, runtime
from tuner.measure import abi
from tuner.errors import BuildError, KernelInputError

CHECK = {False: "deferred", "deferred": "deferred", True: "sync", "sync": "sync"}  # how a call reports bad input
# c10's dtype names, as a variant's table gives them, to torch's
TORCH_DTYPES = {"Float": "float32", "Half": "float16", "BFloat16": "bfloat16", "Byte": "uint8", "Long": "int64",
                "Int": "int32"}


def dtype_name(tensor) -> str:
    """A tensor's dtype as torch names it ("bfloat16")."""
    return str(tensor.dtype).removeprefix("torch.")


def stream(device: int | None = None) -> int:
    """torch's current CUDA stream (as the raw handle a variant launches on)."""
    import torch

    index = torch.cuda.current_device() if device is None else device
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def launched(rc: int, kernel: "Kernel", what: str) -> None:
    """A variant's launch result: 0, or the CUDA error it returned, raised with CUDA's text for it
    (the worker tells launch errors by that text)."""
    if rc:
        raise RuntimeError(f"variant {kernel.name} {what} failed to launch: {kernel.error_string(rc)}")


class Kernel:
    family: str = ""
    error_text: dict[int, str] = {}  # what each error bit of the family's validation means

    def __init__(self, so: Path, expected_name: str | None = None, entry: str | None = None):
        fam = families.get(self.family)
        self.path = Path(so)
        self._lib = ctypes.CDLL(str(self.path))  # kept alive: the table points into it
        try:  # entry: the table's name in a unit of several
            self.address = runtime.table(self._lib, entry or fam.ENTRY, families.part(self.family, "op").OP.abi,
                                         expected_name)
        except RuntimeError as exc:
            raise BuildError(expected_name or str(so), str(exc)) from exc
        name, fields = abi.table(self.family)
        table = abi.struct(self.family, name).from_address(self.address)
        self.name = table.name.decode()
        for field, kind in fields[2:]:
            value = getattr(table, field)
            if isinstance(kind, abi.Function):  # callable as <field>_fn (a kernel's own methods keep the plain names)
                setattr(self, f"{field}_fn", kind.type(value))
            else:
                setattr(self, field, value.decode() if isinstance(value, bytes) else value)
        self._words = None  # the workspace: a zeroed int32 tensor whose `error_word` validation sets
        self._replaced: list = []  # smaller ones before it
        self.error_word = 0

    def error_string(self, rc: int) -> str:
        """CUDA's text for an error code, from the CUDA runtime the variant's library links."""
        try:
            fn = self._lib.cudaGetErrorString
        except AttributeError:
            return f"CUDA error {rc}"
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int]
        return fn(rc).decode()

    def workspace(self, words: int, device):
        """At least `words` zeroed words on `device`, kept between calls (the variants leave them zeroed,
        all but the error word, which stays set until `take_errors`)."""
        import torch

        words = max(int(words), self.error_word + 1, 64)
        ws = self._words
        if ws is None or ws.numel() < words or ws.device != torch.device(device):
            if ws is not None:
                self._replaced.append(ws)  # calls prepared with it still report there
            self._words = ws = torch.zeros(words, dtype=torch.int32, device=device)
        return ws

    def take_errors(self) -> int:
        """Error bits the variant's validation flagged since the last call (syncs)."""
        bits = 0
        for ws in [*self._replaced, *([self._words] if self._words is not None else [])]:
            word = ws[self.error_word]
            bits |= int(word.item()) & 0xFFFFFFFF
            word.zero_()
        return bits

    def raise_errors(self) -> None:
        """KernelInputError for what validation flagged (the check "sync" of a call)."""
        bits = self.take_errors()
        if bits:
            text = "; ".join(t for bit, t in sorted(self.error_text.items()) if bits & bit) or f"error bits {bits}"
            raise KernelInputError(f"{families.part(self.family, 'op').OP.op}: invalid input: {text}")
