"""A built variant loaded into this process: its C table found in the library (ctypes) and
checked (the family's C ABI, the variant's name), and the family's torch binding loaded, which
calls the variant by its table's address. Each family's kernel class names its table's fields
after `abi` and `name`; those that are not function pointers become attributes."""

from __future__ import annotations

import ctypes
from pathlib import Path

from tuner import binding, families, runtime
from tuner.errors import BuildError

CHECK = {False: 0, "deferred": 0, True: 1, "sync": 1, "async": 2}  # how a call reports bad input


class Kernel:
    family: str = ""
    fields: list[tuple[str, type]] = []  # the table's fields after (abi, name), as ctypes types

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._table = type(f"{cls.__name__}Table", (ctypes.Structure,),
                          {"_fields_": [("abi", ctypes.c_int), ("name", ctypes.c_char_p), *cls.fields]})

    def __init__(self, so: Path, expected_name: str | None = None, entry: str | None = None):
        fam = families.get(self.family)
        self.path = Path(so)
        self._lib = ctypes.CDLL(str(self.path))  # kept alive: the table points into it
        try:  # entry: the table's name in a unit of several
            self.address = runtime.table(self._lib, entry or fam.ENTRY, families.part(self.family, "op").OP.abi,
                                         expected_name)
        except RuntimeError as exc:
            raise BuildError(expected_name or str(so), str(exc)) from exc
        table = self._table.from_address(self.address)
        self.name = table.name.decode()
        for name, kind in self.fields:
            if kind is ctypes.c_void_p:  # the variant's functions: the binding calls them, by the table
                continue
            value = getattr(table, name)
            setattr(self, name, value.decode() if isinstance(value, bytes) else value)
        self.ops = binding.load(self.family)

    def take_errors(self) -> int:
        """Error bits the variant's validation flagged since the last call (syncs)."""
        return int(self.ops.take_errors())
