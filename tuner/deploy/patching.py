"""One line from a model to the tuned ops: `tuner.patch(model)`.

    op = tuner.load("exports/rms_norm-H100")     # or tuner.patch(model, "exports/rms_norm-H100")
    patched = tuner.patch(model)                 # every module a loaded export serves
    print(patched)                               # which modules, by which family
    patched.undo()                               # the model as it was (or: with tuner.patch(model): ...)

Each family names, in `tuner/families/<name>/patch.py`, the module classes its op replaces and
a forward for each (`MODULES`: the class's qualified name -> forward(self, *args)), matched by a
module's exact class: a subclass with a forward of its own is not the class the family knows.
A matched module gets that forward bound to it (functools.partial(forward, module): a deep copy
or a pickle of the model keeps it, bound to the copy) as an instance attribute in place of its
class's: its parameters, buffers, state_dict and hooks stay as they were, and undo() deletes it. The forward calls the tuned op with the module's settings, and
where the op has no variant for a call (another device or dtype, an argument it does not take),
torch's function or the module's own forward serves it.

Only families with a loaded export are patched; modules of other families are listed as skipped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

from tuner import families, runtime
from tuner.errors import SpaceError, TunerError


def class_name(module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def forwards() -> dict[str, tuple[str, Callable]]:
    """Qualified class name -> (family, forward) over the installed families with a patch.py."""
    found: dict[str, tuple[str, Callable]] = {}
    for name in families.names():
        try:
            module = families.part(name, "patch")
        except SpaceError:  # the family replaces no module
            continue
        for cls, forward in module.MODULES.items():
            found[cls] = (name, forward)
    return found


@dataclass
class Patched:
    """What tuner.patch changed: (module name, family) per patched module, and the modules of
    families with no loaded export, left alone. A context manager that undoes on exit."""
    model: object
    modules: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    _installed: list = field(default_factory=list, repr=False)  # (module, the forward given it)

    def undo(self) -> None:
        """Each patched module's own forward again, wherever it now sits in the model; a forward
        that something else has put there since is left as it is."""
        for module, forward in self._installed:
            if module.__dict__.get("forward") is forward:
                del module.__dict__["forward"]
        self.modules, self._installed = [], []

    def __enter__(self) -> "Patched":
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __str__(self) -> str:
        counts: dict[str, int] = {}
        for _, family in self.modules:
            counts[family] = counts.get(family, 0) + 1
        done = ", ".join(f"{n} {family}" for family, n in counts.items()) or "no module"
        left = f"; {len(self.skipped)} left alone (no {', '.join(sorted({f for _, f in self.skipped}))} export " \
               "loaded)" if self.skipped else ""
        return f"tuned ops serve {done}{left}"


def patch(model, *exports, **load) -> Patched:
    """Hand `model`'s modules that a loaded export serves to the tuned ops (the exports named
    are loaded first, with tuner.load's keyword arguments). A module patched before is kept as
    it is; TunerError where no export is loaded at all."""
    import torch

    from tuner.deploy import load as deploy

    if not isinstance(model, torch.nn.Module):
        raise TunerError(f"tuner.patch takes a torch.nn.Module, got {type(model).__name__}")
    for directory in exports:
        deploy.load(directory, **load)  # what tuner.load does with a folder
    if not runtime.loaded_families():
        raise TunerError("no tuned op is loaded: tuner.load(EXPORT) first, or tuner.patch(model, EXPORT)")
    known = forwards()
    patched = Patched(model)
    for name, module in model.named_modules():
        family, forward = known.get(class_name(module), (None, None))
        if family is None or "forward" in module.__dict__:
            continue
        if family not in runtime.loaded_families():
            patched.skipped.append((name, family))
            continue
        module.forward = functools.partial(forward, module)
        patched.modules.append((name, family))
        patched._installed.append((module, module.forward))
    return patched
