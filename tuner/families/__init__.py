"""Kernel families: each is one module (space, reference, inputs) plus its templates."""

from __future__ import annotations

from types import ModuleType

from tuner.errors import SpaceError


def get(name: str) -> ModuleType:
    """The family module by name, imported on first use."""
    if name == "giou":
        from tuner.families import giou

        return giou
    raise SpaceError(f"unknown kernel family {name!r}; known: giou")
