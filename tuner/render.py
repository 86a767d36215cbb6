"""Jinja2 rendering of a variant into CUDA source."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from tuner import families
from tuner.errors import BuildError
from tuner.variant import Variant


def templates_dir(family: str) -> Path:
    """A family's templates: `templates/<family>/`."""
    return families.templates(family)


@functools.lru_cache(maxsize=None)
def _environment(family: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir(family))),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(variant: Variant, focus: dict | None = None) -> str:
    """The variant's CUDA source; a template error names the variant. `focus` (a family's
    `search_focus(problem)`) narrows it to the kernel instances one problem runs: a search
    compiles only those (the same machine code for them), an export every instance."""
    family = families.get(variant.family)
    try:
        context = {**family.render_context(variant), **(focus or {})}
        return _environment(variant.family).get_template(family.TEMPLATE).render(**context)
    except jinja2.TemplateError as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        raise BuildError(variant.name, f"template {family.TEMPLATE}{where}: {exc}") from exc


def header_text(family_name: str) -> str:
    """The headers a family's sources include, concatenated (part of every content hash)."""
    family = families.get(family_name)
    return "".join((templates_dir(family_name) / h).read_text() for h in family.HEADERS)
