"""Jinja2 rendering of a variant into CUDA source."""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

import jinja2

from tuner import families
from tuner.errors import BuildError
from tuner.space import with_defaults
from tuner.variant import Variant


def templates_dir(family: str) -> Path:
    """A family's templates: `templates/<family>/`."""
    return families.templates(family)


@functools.lru_cache(maxsize=None)
def _environment(family: str) -> jinja2.Environment:
    return jinja2.Environment(
        # a family's own folder, then tuner's templates: a template may include a built-in
        # family's parts by path ("cross_entropy/rows.cuh.j2"), a plugin family's too
        loader=jinja2.FileSystemLoader([str(templates_dir(family)), str(families.templates_root())]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(variant: Variant, focus: dict | None = None) -> str:
    """The variant's CUDA source; a template error names the variant. `focus` (a family's
    `search_focus(problem)`) narrows it to the kernel instances one problem runs: a search
    compiles only those (the same machine code for them), an export every instance. A joined
    variant (`Variant.joined`) is both points' sources and the family's `JOINED_TEMPLATE`, a table that
    takes the forward of one and the backward of the other."""
    family = families.get(variant.family)
    halves = variant.halves()
    if halves:
        return _render_joined(variant, *halves, focus)
    # parameters recorded before a dimension existed render as they ran: that dimension off (None)
    variant = Variant.of(variant.family, with_defaults(getattr(family, "DIMS", ()), variant.as_dict()))
    own = getattr(family, "render_context", None)
    context = own(variant) if own else default_context(family, variant)
    return _render(family, variant, family.TEMPLATE, {**context, **(focus or {})})


_CTYPE = {"float32": "float", "float16": "tuner_half", "bfloat16": "tuner_bfloat16", "float64": "double",
          "uint8": "unsigned char", "int8": "signed char", "int32": "int", "int64": "long long"}
_C10 = {"float32": "Float", "float16": "Half", "bfloat16": "BFloat16", "float64": "Double", "uint8": "Byte",
        "int8": "Char", "int32": "Int", "int64": "Long"}


def default_context(family, variant: Variant) -> dict:
    """What a kernel template reads where its family gives no `render_context`: the variant's
    parameters and `name`; and for each tensor of a declared op whose dtype the variant fixes (a
    parameter of the tensor's name), `<tensor>_ctype` (the kernel's type: "tuner_bfloat16" of
    templates/common/half.cuh.j2, which a template includes in place of cuda_bf16.h) and
    `<tensor>_torch` (c10's name, for the table: "BFloat16")."""
    ctx = {**variant.as_dict(), "name": variant.name}
    op = getattr(family, "OP_DECLARATION", None)
    for t in op.tensors if op is not None else ():
        dtype = ctx.get(t.name, t.dtypes[0] if len(t.dtypes) == 1 else None)
        if dtype in _CTYPE:
            ctx.update({f"{t.name}_ctype": _CTYPE[dtype], f"{t.name}_torch": _C10[dtype]})
    return ctx


def _render(family, variant: Variant, template: str, context: dict) -> str:
    try:
        return _environment(variant.family).get_template(template).render(**context)
    except jinja2.TemplateError as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        raise BuildError(variant.name, f"template {template}{where}: {exc}") from exc


_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.M)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)


def includes(sources: list[str]) -> list[str]:
    """The include lines of several sources, once each, for the top of one translation unit (a
    header included inside a namespace would declare its names there)."""
    return list(dict.fromkeys(m.strip() for src in sources for m in _INCLUDE.findall(src)))


def in_namespace(source: str, namespace: str) -> str:
    """A source inside `namespace`, its includes left to the top (`includes`) and the macros it
    defines undefined after it."""
    body = _INCLUDE.sub(lambda m: f"// {m.group(0).strip()} (at the top)", source)
    undef = "".join(f"#undef {name}\n" for name in dict.fromkeys(_DEFINE.findall(source)))
    return f"namespace {namespace} {{\n{body}\n}}  // namespace {namespace}\n{undef}"


def _render_joined(joined: Variant, forward: Variant, backward: Variant, focus: dict | None) -> str:
    """Both sources in namespaces of their own, their table functions renamed in the text (not
    by #define: a joined variant is built in a unit with other variants like any other, and the
    unit renames its own table function by #define), then the family's joined table."""
    family = families.get(joined.family)
    template = getattr(family, "JOINED_TEMPLATE", None)
    if template is None:
        raise BuildError(joined.name, f"family {joined.family} has no JOINED_TEMPLATE: its variants do not join")
    tag = hashlib.sha256(joined.name.encode()).hexdigest()[:12]  # unique within any unit
    texts, names = [], {}
    for part, variant in (("forward", forward), ("backward", backward)):
        names[part] = (f"tuner_half_{part}_{tag}", f"{family.ENTRY}_{part}_{tag}")
        # `half`: a template may leave out the other half's kernels (compiled for nothing)
        texts.append(re.sub(rf"\b{family.ENTRY}\b", names[part][1], render(variant, {**(focus or {}), "half": part})))
    glue = _render(family, joined, template, {"name": joined.name, "entry": family.ENTRY,
                                              "forward": "::".join(names["forward"]),
                                              "backward": "::".join(names["backward"])})
    return "\n".join([f"// {joined.name}: the forward of {forward.name}, the backward of {backward.name}",
                      *includes(texts + [glue]), "",
                      *(in_namespace(text, names[part][0]) for text, part in zip(texts, names)),
                      _INCLUDE.sub("", glue)])


def headers(family_name: str) -> dict[str, str]:
    """The headers a family's sources include, name -> text: a declared op's C ABI rendered from
    its declaration (tuner/build/declared.py), others read from its templates folder."""
    from tuner.build import declared

    family, op = families.get(family_name), declared.declaration(family_name)
    return {h: declared.header(op, family_name) if op is not None and h == f"{family_name}_abi.h"
            else (templates_dir(family_name) / h).read_text() for h in family.HEADERS}


def write_headers(family_name: str, folder: Path) -> Path:
    """The family's headers written into `folder` (a build's), for its sources to include."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in headers(family_name).items():
        path = folder / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    return folder


def header_text(family_name: str) -> str:
    """The headers a family's sources include, concatenated (part of every content hash)."""
    return "".join(headers(family_name).values())
