"""Serve by measurement around the tuned problems: the export's check times the op (the nearest
variant) against torch's op (as the op calls it: behind its guards, tuner.deploy.serving) at shapes
around and between the problems a variant serves, and the op serves each of those shapes with
whichever won, for each kind of call on its own (`verdict`: calls without a gradient by the
forward's times, training calls by forward+backward's). The binding picks the nearest of
everything it binds (tuned problems and these shapes, in the shape key's log space; tuner_op.h),
so that a call goes where the measurement nearest to it went, and torch's op serves beyond the
family's reach of every one.

The shapes: per dtype pair and kind, each variant-served problem's key a factor of 4 smaller and
larger along each of its sizes, and the midpoint (geometric mean) of every two of its problems; not
a pair whose torch op is unfused (variants serve all of it) nor a family without a baseline. Where
torch's path carries a guard (the declaration's `guards`: a launch before torch's op), the smaller
side is a grid: each size 1, 4 or 16 times smaller, so that small calls, bound by the host where the
op's one launch and torch's two differ most, are served by what was measured near them. A key's
loose sizes (the declaration's `loose`: EmbeddingBag's count of bags, which never puts a call beyond
reach) are kept or made 4x and 16x larger beside each of those shapes.
tuner.deploy.serving.measure times them, in the check's process.
"""

from __future__ import annotations

import itertools
import math

from tuner import families

FACTOR = 4  # around a problem: its sizes this much smaller and larger, one at a time
MOST = 16  # shapes measured per dtype pair and kind, the nearest to a tuned problem first (8 more a loose size)
SLOWER = 1.0  # a checked shape whose op is slower than torch's op in a cell by more than this: torch's there
KINDS = ("inference", "training")  # the calls a verdict is given for: without a gradient (a forward), with one


def kinds_apart(family: str) -> bool:
    """Whether the family's op serves each kind of call apart: a training call's forward is its
    `<name>_forward` op (a declaration with `saves`), which does not choose again; without one, the
    forward below autograd cannot tell a training call's from an inference call, and torch's op
    serves a shape where the op lost either kind (`verdict`'s `apart`)."""
    op = getattr(families.get(family), "OP_DECLARATION", None)
    return op is not None and bool(op.saves)


def verdict(cells: dict[str, float | None], slower: float = SLOWER, apart: bool = True) -> dict[str, str]:
    """Who serves a checked shape (a tuned problem or one around them), from the op's ratios to
    torch's op per cell (tuner.report.bench's CELLS): each kind of call by its own cells (inference:
    the forward's; training: forward+backward's), lost where a cell is slower by more than `slower`
    or has no time. {"served_by": "torch"} where both kinds were lost; {"served_by": "variant",
    "torch_serves": kind} where one was, so that a forward slower than torch's does not give torch
    the training calls a variant wins, nor the other way round; else {"served_by": "variant"}. A kind
    with no cell at all was not shown to be won: lost. `apart=False` (`kinds_apart`): torch's op
    serves where either kind was lost."""
    kind = {cell: "training" if cell.startswith("fwd+bwd") else "inference" for cell in cells}
    lost = {kind[cell] for cell, r in cells.items() if r is None or r > slower} | (set(KINDS) - set(kind.values()))
    if len(lost) == len(KINDS) or (lost and not apart):
        return {"served_by": "torch"}
    return {"served_by": "variant", **({"torch_serves": lost.pop()} if lost else {})}


def scales(sizes: int, guarded: bool, loose: int = 0) -> list[tuple[float, ...]]:
    """How a tuned key's sizes are scaled for the shapes around it: each 4x larger and 4x smaller,
    one at a time; where torch's path is guarded, every mix of 1, 4 and 16 times smaller instead.
    The key's last `loose` sizes (the declaration's: a count of bags) are kept, or made 4 or 16
    times larger, beside the tuned sizes and each smaller shape (not the larger ones: a call's
    entries grow 16x at most): a variant tuned at one count serves every other."""
    fixed = sizes - loose
    larger = [tuple(FACTOR if i == d else 1 for i in range(fixed)) for d in range(fixed)]
    if not guarded:
        smaller = [tuple(1 / FACTOR if i == d else 1 for i in range(fixed)) for d in range(fixed)]
    else:
        steps = itertools.product((1, 1 / FACTOR, 1 / FACTOR ** 2), repeat=fixed)
        smaller = [f for f in steps if any(x != 1 for x in f)]
    more = list(itertools.product((1, FACTOR, FACTOR ** 2), repeat=loose))
    return [f + m for f in [(1,) * fixed] + smaller for m in more if any(x != 1 for x in f + m)] + [
        f + (1,) * loose for f in larger]


def grid(family: str, entries: list[dict]) -> list[dict]:
    """The shapes to measure: each a problem (the nearest tuned one's, its key sizes changed) and
    `near`, the tuned problem whose variant serves it unless torch's op wins there."""
    spec = families.part(family, "op").OP
    if not spec.baseline or spec.reach <= 0:
        return []
    from tuner.build import declared
    from tuner.deploy.binaries import problem_key

    op = declared.declaration(family)
    names = list(op.key or op.sizes)  # the key's sizes, each a field of the family's problem
    fam = families.get(family)
    out = []
    groups: dict[tuple, list[dict]] = {}
    for e in entries:
        if spec.unfused is not None and spec.unfused(e["problem"]):
            continue
        fixed = tuple(sorted(fam.space_for(e["problem"]).fixed.items()))
        groups.setdefault((fixed, spec.shape(e["problem"])[1]), []).append(e)
    for group in groups.values():
        if not all(n in e["problem"] for e in group for n in names):  # a key the problem does not name
            continue
        keys = [tuple(spec.shape(e["problem"])[0]) for e in group]  # every tuned problem, in the binding's order
        tuned = [k for k, e in zip(keys, group) if e.get("served_by", "variant") == "variant"]  # measured around
        found = set()
        for key in tuned:
            for f in scales(len(key), bool(op.guards), op.loose):
                found.add(tuple(max(1, round(k * x)) for k, x in zip(key, f)))
        for a, b in itertools.combinations(tuned, 2):
            found.add(tuple(max(1, round(math.sqrt(x * y))) for x, y in zip(a, b)))
        found -= set(keys)  # a tuned problem's own verdict decides there, torch's included

        def distance(key, to):  # as the binding measures it (tuner_op.h's nearest): differences of logs
            return sum(abs(math.log(max(x, 1)) - math.log(max(y, 1))) for x, y in zip(key, to))

        def nearest(key) -> int:  # as the binding chooses (tuner_op.h): the first of equal distances
            best, best_d = 0, distance(key, keys[0])
            for i in range(1, len(keys)):
                d = distance(key, keys[i])
                if d < best_d - 1e-12:
                    best, best_d = i, d
            return best

        for key in sorted(found, key=lambda k: (min(distance(k, t) for t in tuned), k))[:MOST + 8 * op.loose]:
            near = nearest(key)
            problem = {**group[near]["problem"], **dict(zip(names, key))}
            out.append({"problem": problem, "near": problem_key(group[near]["problem"])})
    return out


def decide(points: list[dict], ratios: dict[str, dict], slower: float, apart: bool = True) -> list[dict]:
    """The measured shapes with who serves each kind of call there (`verdict`: torch's op where the
    op was slower than it by more than `slower`, or a cell has no time; `apart`, `kinds_apart`);
    shapes not measured (too big for the GPU, say) are left out, so that the tuned problems around
    them decide."""
    from tuner.deploy.binaries import problem_key

    out = []
    for p in points:
        cells = ratios.get(problem_key(p["problem"]))
        if cells is not None:
            out.append({**p, **verdict(cells, slower, apart), "checked": cells})
    return out
