"""A family's C ABI header (`HEADERS` in templates/<family>/, or rendered from its declared op)
read into ctypes: its argument structs and its variant table, each `typedef struct { ... } Name;`
of plain fields and function pointers. The search calls variants through these
(tuner/measure/kernel.py), so the header is the one place the C interface is written;
tests/test_abi_mirror.py holds every struct read here against the layout the C compiler gives it."""

from __future__ import annotations

import ctypes
import functools
import re

from tuner.errors import SpaceError

_TYPES = {
    "char": ctypes.c_char, "unsigned char": ctypes.c_ubyte, "int": ctypes.c_int, "unsigned": ctypes.c_uint,
    "unsigned int": ctypes.c_uint, "long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong,
    "size_t": ctypes.c_size_t, "float": ctypes.c_float, "double": ctypes.c_double,
    "cudaStream_t": ctypes.c_void_p,  # a pointer to an opaque struct
}
_STRUCT = re.compile(r"typedef\s+struct\s*\{(.*?)\}\s*(\w+)\s*;", re.S)
_FUNCTION = re.compile(r"^(.*?)\(\s*\*\s*(\w+)\s*\)\s*\((.*)\)$", re.S)


class Function:
    """A function pointer field: its ctypes function type (`.type`)."""

    def __init__(self, result, *args):
        self.type = ctypes.CFUNCTYPE(result, *args)


def _ctype(decl: str, where: str):
    """The ctypes type of one C type (a pointer: `c_void_p`, or `c_char_p` for a string)."""
    stars = decl.count("*")
    base = " ".join(decl.replace("*", " ").replace("const", " ").split())
    if stars:
        return ctypes.c_char_p if base == "char" and stars == 1 else ctypes.c_void_p
    if base == "void":  # a function's result
        return None
    if base not in _TYPES:
        raise SpaceError(f"{where}: C type {decl.strip()!r} has no ctypes mirror here (tuner/measure/abi.py)")
    return _TYPES[base]


def _parameter(text: str, where: str):
    """A function parameter's ctypes type, its name (if any) left out."""
    text = text.strip()
    words = text.replace("*", " * ").split()
    if "*" not in words and " ".join(w for w in words if w != "const") not in _TYPES and len(words) > 1:
        text = " ".join(words[:-1])  # "long long rows" -> "long long"
    elif "*" in words and words[-1] != "*":
        text = " ".join(words[:-1])  # "const float* x" -> "const float *"
    return _ctype(text, where)


def _fields(body: str, where: str) -> list[tuple[str, object]]:
    """The fields of one struct's body, in order: (name, ctypes type or Function)."""
    body = re.sub(r"//[^\n]*|/\*.*?\*/", " ", body, flags=re.S)
    fields: list[tuple[str, object]] = []
    for decl in (d.strip() for d in body.split(";")):
        if not decl:
            continue
        function = _FUNCTION.match(decl)
        if function:
            result, name, params = function.groups()
            args = [_parameter(p, f"{where}.{name}") for p in params.split(",") if p.strip() not in ("", "void")]
            fields.append((name, Function(_ctype(result, f"{where}.{name}"), *args)))
            continue
        first, *more = [part.strip() for part in decl.split(",")]
        head = re.match(r"^(.*?)([\s*]+)(\w+)$", first)
        if head is None:
            raise SpaceError(f"{where}: cannot read the field {decl!r}")
        base = head.group(1)
        declarators = [(head.group(2).count("*"), head.group(3))]  # `long long rows, *counts;`
        declarators += [(part.count("*"), part.replace("*", "").strip()) for part in more]
        for stars, name in declarators:
            fields.append((name, _ctype(base + "*" * stars, f"{where}.{name}")))
    return fields


@functools.cache
def declarations(family: str) -> dict[str, list[tuple[str, object]]]:
    """Each struct of the family's ABI headers: name -> [(field, ctypes type or Function)]."""
    from tuner.build.render import headers

    found: dict[str, list[tuple[str, object]]] = {}
    for header, text in headers(family).items():
        found.update(parse(text, header))
    return found


def parse(text: str, where: str = "header") -> dict[str, list[tuple[str, object]]]:
    """Each `typedef struct { ... } Name;` of a header's text: name -> [(field, ctypes type or Function)]."""
    return {name: _fields(body, f"{where}: {name}") for body, name in _STRUCT.findall(text)}


def mirror(name: str, fields: list[tuple[str, object]]) -> type[ctypes.Structure]:
    """A ctypes Structure of those fields (a function pointer as a plain pointer)."""
    return type(name, (ctypes.Structure,),
                {"_fields_": [(n, ctypes.c_void_p if isinstance(k, Function) else k) for n, k in fields]})


@functools.cache
def struct(family: str, name: str) -> type[ctypes.Structure]:
    """The ctypes mirror of the struct `name` (a function pointer as a plain pointer)."""
    try:
        fields = declarations(family)[name]
    except KeyError:
        raise SpaceError(f"family {family!r}: its ABI headers declare no struct {name!r}") from None
    return mirror(name, fields)


def table(family: str) -> tuple[str, list[tuple[str, object]]]:
    """The variant table's struct name and fields: the one struct whose first fields are `int abi`
    and `const char* name`."""
    tables = [(name, fields) for name, fields in declarations(family).items()
              if [n for n, _ in fields[:2]] == ["abi", "name"]]
    if len(tables) != 1:
        raise SpaceError(f"family {family!r}: its ABI headers should declare one table (a struct starting "
                         f"`int abi; const char* name;`), found {len(tables)}")
    return tables[0]
