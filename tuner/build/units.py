"""Translation units of variants (tuner.build.compile builds them).

nvcc's fixed cost (host preprocessing, cudafe++, the host compiler reading CUDA's headers: about
1.3 s of a core) is paid once per translation unit, so a batch is split into units of up to MAX_PER_UNIT
variants, as many units as there are cores when the batch allows. In a unit each variant's source
sits in its own namespace, and its one C-linkage name (the family's `ENTRY`, the variant's table)
is renamed `<ENTRY>_<key>` by `#define`, so that every variant's kernels compile exactly as they
would alone (ptxas compiles each kernel by itself) and each keeps its own table.
"""

from __future__ import annotations

import hashlib

from tuner import families
from tuner.build.render import in_namespace, includes
from tuner.variant import Variant

# nvcc's fixed cost is ~1.3 s of a core, a search's variant's own 0.25-0.4 s (units of 1-16 focused GIoU and
# RMSNorm variants, a CI core, 2026-12-07): 16 a unit pay it a fifth of the unit
MAX_PER_UNIT = 16

def namespace(key: str) -> str:
    return f"tuner_variant_{key}"


def unit_source(members: list[tuple[str, str]], entry: str) -> str:
    """Several variants (key, source) as one translation unit.

    Includes move to the top (a header included inside a namespace would declare
    its names there); each source goes into its own namespace with `entry` renamed
    `<entry>_<key>`, and the macros it defines are undefined after it. A family's
    template therefore gives C linkage to its table function only, and includes
    its headers unconditionally.
    """
    parts = [f"// {len(members)} variants, each in its own namespace (tuner/build/compile.py)",
             *includes([src for _, src in members]), ""]
    for key, src in members:
        parts.append(f"#define {entry} {entry}_{key}\n{in_namespace(src, namespace(key))}#undef {entry}\n")
    return "\n".join(parts)


def plan_units(todo: dict[str, tuple[Variant, str]], jobs: int, staggered: bool = False) -> list[list[str]]:
    """Keys grouped into translation units: per family, as many units as cores while each holds
    at most MAX_PER_UNIT. A family without an `ENTRY` compiles one variant per unit. `staggered`:
    the units' sizes grow from a third of the even share to five thirds of it (`staggered_sizes`),
    smallest first, so that they end one after another rather than all at once."""
    by_family: dict[str, list[str]] = {}
    for key, (variant, _) in todo.items():
        by_family.setdefault(variant.family, []).append(key)
    units = []
    for family, keys in by_family.items():
        if not getattr(families.get(family), "ENTRY", None):
            units += [[k] for k in keys]
            continue
        sizes = staggered_sizes(len(keys), jobs) if staggered else None
        if sizes is None:
            size = min(MAX_PER_UNIT, max(1, -(-len(keys) // jobs)))
            sizes = [size] * -(-len(keys) // size)
        for size in sizes:
            units.append(keys[:size])
            keys = keys[size:]
    return units


def staggered_sizes(n: int, jobs: int) -> list[int] | None:
    """`jobs` unit sizes for `n` variants, growing linearly from (1 - r) n/jobs to (1 + r) n/jobs
    and summing to n, with r = 2/3 or less where that would leave a unit under 2 variants or over
    MAX_PER_UNIT; None where no spread is left (even units then). A unit costs nvcc's fixed ~1.3 s
    plus 0.25-0.4 s a variant (a search's GIoU and RMSNorm units on a CI core): the smallest end first,
    and the GPU starts on them while the largest compile."""
    share = n / jobs if jobs > 1 else 0.0
    spread = min(2 / 3, MAX_PER_UNIT / share - 1, 1 - 2 / share) if share >= 2 else 0.0
    if spread < 0.2:
        return None
    bounds = [round(sum(share * (1 - spread + 2 * spread * i / (jobs - 1)) for i in range(k))) for k in range(jobs + 1)]
    bounds[-1] = n
    return sorted(b - a for a, b in zip(bounds, bounds[1:]))


def unit_name(family: str, keys: list[str]) -> str:
    if len(keys) == 1:
        return f"{family}-{keys[0]}"
    return f"{family}-unit-{hashlib.sha256(' '.join(keys).encode()).hexdigest()[:20]}"
