"""torch's own signatures on the tuned ops, for code that calls functions rather than modules:

    import tuner.functional as TF
    tuner.load("exports/rms_norm-H100")
    y = TF.rms_norm(x, (4096,), weight, 1e-6)                  # as torch.nn.functional.rms_norm
    bags = TF.embedding_bag(ids, table, offsets, mode="sum")   # as torch.nn.functional.embedding_bag
    loss = TF.generalized_box_iou_loss(pred, target, "mean")   # as torchvision.ops's

Each takes every call its torch function takes and gives torch's results: the calls a loaded
export's op serves go to it (a variant, or torch's op where the export says so), all others to
torch's function. Each family names its functions in its op.py (`FUNCTIONS`); this module finds
them by name."""

from __future__ import annotations

from typing import Callable

from tuner import families
from tuner.errors import SpaceError


def functions() -> dict[str, Callable]:
    """Name -> function over the installed families."""
    found = {}
    for family in families.names():
        try:
            found.update(getattr(families.part(family, "op"), "FUNCTIONS", {}))
        except SpaceError:
            continue
    return found


def __getattr__(name: str) -> Callable:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        found = functions()[name]
    except KeyError:
        raise AttributeError(f"tuner.functional has no {name!r}; it has {', '.join(sorted(functions()))}") from None
    globals()[name] = found  # found once: a later lookup is a module attribute's
    return found


def __dir__() -> list[str]:
    return sorted(functions())
