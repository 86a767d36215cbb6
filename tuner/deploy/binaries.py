"""What an export's op binds, and the binaries that `export-best` writes beside its sources.

The binaries: the family's torch binding (its op in C++) and one library of every variant the
op binds (the winners, and for a dtype pair that was not tuned, the nearest problem's parameters
rendered for it), built for the study's GPU architecture. The manifest records their SHA-256
and the build identity, so that `tuner.runtime` can load them without a toolchain where
torch, CUDA, Python, platform and GPU match.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tuner import paths, runtime
from tuner.build import binding
from tuner.build import compile as build
from tuner.build import toolkit
from tuner.errors import TunerError
from tuner.variant import Variant


def problem_key(problem: dict) -> str:
    """A problem as the export names it (its check's ratios, a measured shape's tuned problem)."""
    return json.dumps(problem, sort_keys=True)


def bound(fam, spec, entries: list[dict], regions: list[dict] = ()) -> list[dict[str, Any]]:
    """The winners an op binds, in the order the binding gets them: per dtype pair of the family,
    its tuned entries (those the baseline serves, `served_by` "torch", without a variant), then the
    shapes measured around them (`regions`, tuner.deploy.regions: torch's op, or the variant of the
    tuned problem `near` them, bound again at the shape). An
    untuned pair is the baseline's where the op has one (nothing bound; `OpSpec.untuned_by_baseline`)
    and torch's op for it is fused (`OpSpec.unfused`); else every entry's parameters are rendered for
    it (the nearest valid point; of a joined variant, each half's; where torch's op is unfused, also
    those of a problem torch's fused op won), with `tuned_for` naming the pair they were tuned for and
    the problem given the pair's own dtypes; where torch's op is fused and serves beyond a reach,
    the tuned pair nearest it in dtypes alone (`_source`), its entries and measured shapes as its
    verdicts say. A kind no search tuned in a pair
    (`_untuned_kinds`) is bound as the pair's first tuned kind is. `fam`: the family's module, `spec`
    its op's OpSpec."""
    baseline = spec.baseline
    out = []
    tuned = _tuned_pairs(fam, entries)
    for space in fam.all_spaces():
        start = len(out)
        same = [e for e in entries if fam.space_for(e["problem"]).fixed == space.fixed]
        unfused = spec.unfused is not None and spec.unfused(space.fixed)
        if same:
            out += _tuned_pair(fam, baseline, same, regions, space.fixed)
        elif not (baseline and spec.untuned_by_baseline and not unfused):
            source = _source(spec, space.fixed, tuned)
            mine = [e for e in entries if source is None or fam.space_for(e["problem"]).fixed == source]
            measured = [r for r in regions if source is not None and fam.space_for(r["problem"]).fixed == source]
            out += _untuned_pair(fam, baseline, mine, measured, space, unfused)
        out += _untuned_kinds(fam, out[start:])
    return out


def _tuned_pairs(fam, entries: list[dict]) -> list[dict]:
    """The fixed dtypes of every pair some entry was tuned for, in the family's order."""
    named = [fam.space_for(e["problem"]).fixed for e in entries]
    return [s.fixed for s in fam.all_spaces() if s.fixed in named]


def _source(spec, fixed: dict, tuned: list[dict]) -> dict | None:
    """The one tuned pair an untuned pair is served as, where torch's op is fused and serves beyond
    a reach (else None: every entry's parameters, the nearest serving a call): the one that shares
    its first dtype (a weight's, x's), else its second, ...; the first such in the family's order.
    One pair's verdicts, so that two tuned pairs' differing verdicts at a shape never meet in one."""
    if not tuned or spec.reach <= 0 or (spec.unfused is not None and spec.unfused(fixed)):
        return None
    return max(tuned, key=lambda t: tuple(t.get(k) == v for k, v in fixed.items()))


def _tuned_pair(fam, baseline: bool, same: list[dict], regions, fixed: dict) -> list[dict]:
    """A tuned pair's binds: its entries, then its measured shapes. A measured shape takes the
    variant of the tuned problem `near` it, the one the export's check timed there, whoever serves
    that problem itself (the check may have given it to torch's op while its variant won around it);
    of two entries of one problem (two studies), the first, as the binding's choice takes it."""
    out, near = [], {}
    for e in same:
        mine = {"problem": e["problem"], "variant": e["variant"], "params": e["params"], "tuned_for": ""} \
            if "variant" in e else None
        if mine is not None:
            near.setdefault(problem_key(e["problem"]), mine)
        out.append({"problem": e["problem"], "served_by": "torch"}
                   if mine is None or (baseline and e.get("served_by") == "torch") else _kind(mine, e, baseline))
    return out + _measured(near, [r for r in regions if fam.space_for(r["problem"]).fixed == fixed], fixed)


def _untuned_pair(fam, baseline: bool, entries: list[dict], regions, space, unfused: bool) -> list[dict]:
    """An untuned pair's binds: every entry's parameters rendered for it at the entry's problem in
    the pair's dtypes, then every measured shape as its tuned pair's verdict says."""
    out, near = [], {}
    for e in entries:
        v = _nearest(space, Variant.of(fam.FAMILY, e["params"]))
        mine = {"problem": {**e["problem"], **space.fixed}, "variant": v.name, "params": v.as_dict(),
                "tuned_for": "/".join(map(str, fam.space_for(e["problem"]).fixed.values()))}
        near.setdefault(problem_key(e["problem"]), mine)  # as the tuned pair's (`_tuned_pair`)
        torch_won = baseline and e.get("served_by") == "torch" and not unfused  # torch beat the tuned pair's winner
        out.append({"problem": mine["problem"], "served_by": "torch"} if torch_won
                   else _kind(mine, e, baseline and not unfused))
    return out + _measured(near, regions, space.fixed)


def _kind(bind: dict, verdict: dict, baseline: bool) -> dict:
    """A variant's bind with the kind of call torch's op serves there (`torch_serves`, where the
    check gave it one kind: tuner.deploy.regions.verdict), given a baseline to serve it."""
    kind = verdict.get("torch_serves") if baseline else None
    return {**bind, "torch_serves": kind} if kind else bind


def _measured(near: dict, regions, fixed: dict) -> list[dict]:
    """The binds of shapes measured around tuned problems, in the pair's dtypes `fixed`: torch's op
    where it won, else the bind of the tuned problem `near` them (by its key), at the shape, with
    the kind of call torch's op won there, if one."""
    return [{"problem": {**r["problem"], **fixed}, "served_by": "torch"}
            if r["served_by"] == "torch" or r["near"] not in near
            else _kind({**near[r["near"]], "problem": {**r["problem"], **fixed}}, r, True) for r in regions]


def _untuned_kinds(fam, mine: list[dict]) -> list[dict]:
    """A pair's binds again for each kind (the declaration's `kind`: EmbeddingBag's mode) that
    none of them names, the kind changed and `served_as` naming the kind they were bound for: a
    variant's library runs every kind (exports build them all, and a search checks its finalists in
    each: FINALISTS_WHOLE), so an untuned kind is served as the tuned one's measurements say, not
    by torch's op behind its guard (a launch more, which decides a small call). The first tuned
    kind in the declaration's order is the one copied."""
    op = getattr(fam, "OP_DECLARATION", None)
    if op is None or op.kind is None or not any("variant" in b for b in mine):
        return []
    choices = op.choices(op.kind)
    named = {b["problem"][op.kind] for b in mine}
    source = next(k for k in choices if any("variant" in b and b["problem"][op.kind] == k for b in mine))
    return [{**b, "problem": {**b["problem"], op.kind: k}, "served_as": source}
            for k in choices if k not in named for b in mine if b["problem"][op.kind] == source]


def serving(fam, spec, entries: list[dict], regions: list[dict] = (), unbuilt: frozenset = frozenset()) -> dict[str, str]:
    """Who serves each dtype pair's calls, in words (the manifest's `serving`, by pair "x/weight"),
    as `bound` binds them and the binding chooses: the same rule, said once per pair. `unbuilt`:
    variants that failed to build (`build_variants`), whose calls torch's op serves."""
    binds = [{"problem": b["problem"], "served_by": "torch", "unbuilt": True} if b.get("variant") in unbuilt else b
             for b in bound(fam, spec, entries)]
    tuned = _tuned_pairs(fam, entries)
    said = {}
    for space in fam.all_spaces():
        mine = [b for b in binds if fam.space_for(b["problem"]).fixed == space.fixed]
        won = sorted({_sizes(spec, b["problem"]) for b in mine if b.get("served_by") == "torch" and not b.get("unbuilt")})
        tuned_for = next((b["tuned_for"] for b in mine if b.get("tuned_for")), "")
        one = _one_kind_shapes(spec, mine)
        torch_won = (f"; torch's op near {', '.join(won)}, where it was faster" if won else "") + (
            f"; torch's op for one kind of call at {one}" if one else "")
        if any(b.get("unbuilt") for b in mine) and not any("variant" in b for b in mine):
            text = "torch's op (the parameters rendered for this pair failed to build)"
        elif not any("variant" in b for b in mine):
            text = "torch's op" + (" (no variant was tuned for this pair)" if not won else torch_won)
        elif not spec.baseline or spec.reach == 0 or (spec.unfused is not None and spec.unfused(space.fixed)):
            why = " (torch's op is unfused here)" if spec.unfused is not None and spec.unfused(space.fixed) else ""
            text = f"variants at every shape{why}" + torch_won
        else:
            op = getattr(fam, "OP_DECLARATION", None)
            loose = f" (at any {', '.join(op.key[-op.loose:])})" if op is not None and op.loose else ""
            text = (f"variants within {math.exp(spec.reach):.0f}x of their tuned problems{loose}, torch's op farther"
                    + torch_won)
        measured = [r for r in regions if fam.space_for(r["problem"]).fixed == space.fixed]
        taken = ""  # an untuned pair bound with variants takes its source pair's measured shapes (`bound`)
        source = _source(spec, space.fixed, tuned) if space.fixed not in tuned and tuned_for else None
        if source is not None:
            measured = [r for r in regions if fam.space_for(r["problem"]).fixed == source]
            taken = " of " + "/".join(map(str, source.values()))
        if measured:
            won = [_sizes(spec, r["problem"]) for r in measured if r["served_by"] == "torch"]
            one = _one_kind_shapes(spec, measured)
            text += (f"; measured at {len(measured)} shapes around them{taken}: variants serve "
                     f"{len(measured) - len(won)}, torch's op {len(won)}" + (f" ({', '.join(won)})" if won else "")
                     + (f", and one kind of call at {one}" if one else ""))
        copies = [b for b in mine if b.get("served_as")]
        if copies:
            kind = fam.OP_DECLARATION.kind
            kinds = ", ".join(sorted({str(b["problem"][kind]) for b in copies}))
            text += f"; {kind} {kinds} (no search tuned them) as {copies[0]['served_as']}'s"
        said["/".join(map(str, space.fixed.values()))] = text + (f"; parameters tuned for {tuned_for}" if tuned_for else "")
    return said


def _one_kind_shapes(spec, binds: list[dict]) -> str:
    """The shapes where torch's op serves one kind of call beside a variant (`torch_serves`), each with
    the kind ("4096 x 32 (inference)"), or ""."""
    return ", ".join(sorted({f"{_sizes(spec, b['problem'])} ({b['torch_serves']})" for b in binds
                             if b.get("torch_serves")}))


def _sizes(spec, problem: dict) -> str:
    sizes, _ = spec.shape(problem)
    return " x ".join(str(n) for n in sizes)


def _nearest(space, v: Variant) -> Variant:
    """The valid point of `space` nearest to v's parameters; of a joined variant, each half's."""
    halves = v.halves()
    if halves:
        return Variant.joined(*(_nearest(space, h) for h in halves))
    params = v.as_dict()  # without a dimension added since v was tuned, if that may be None
    return space.nearest({d.name: params[d.name] for d in space.dims if d.name in params})


def build_variants(fam, winners: list[dict], arch: str, sources: dict[str, str] | None = None,
                   jobs: int | None = None, root: Path | None = None,
                   baseline: bool = False) -> tuple[list[dict], dict[str, Path]]:
    """Build the bound winners of the family `fam` (its module) for `arch` (cached); returns them
    with the `library` and `entry` of each (none for a problem the baseline serves), and the
    libraries by name. A tuned winner that fails to build fails the whole; with a `baseline`, one
    rendered for an untuned pair (no search built it) is left to torch's op, with a word why."""
    variants = {w["variant"]: Variant.of(fam.FAMILY, w["params"]) for w in winners if "variant" in w}
    if not variants:
        return winners, {}
    builds = {b.variant.name: b for b in build.build(list(variants.values()), arch, jobs=jobs, root=root,
                                                       sources=sources, serving=True)}
    failed = {b.variant.name: b for b in builds.values() if not b.ok}
    rendered = {w["variant"] for w in winners if w.get("tuned_for")}
    fatal = [b for name, b in failed.items() if not baseline or name not in rendered]
    if fatal:
        raise TunerError(f"{fam.FAMILY}: building {fatal[0].variant.name} for {arch} failed:\n{fatal[0].error}")
    if failed:
        print(f"{fam.FAMILY}: {', '.join(sorted(failed))} (parameters rendered for a dtype pair no search tuned) "
              f"failed to build for {arch}: torch's op serves those calls", file=sys.stderr)
        winners = [{"problem": w["problem"], "served_by": "torch", "unbuilt": w["variant"]}
                   if w.get("variant") in failed else w for w in winners]
    entry = fam.ENTRY
    placed = [{**w, "library": builds[w["variant"]].so.name, "entry": builds[w["variant"]].entry or entry}
              if "variant" in w else w for w in winners]
    return placed, {b.so.name: b.so for b in builds.values() if b.ok}


def write(out: Path, fam, spec, entries: list[dict], arch: str, regions: list[dict] = ()) -> dict[str, Any]:
    """Build and copy an export's binaries into `out`; returns the manifest's `binaries`.
    The variants of one export are compiled together (one translation unit of up to 16)."""
    winners = bound(fam, spec, entries, regions)
    placed, libraries = build_variants(fam, winners, arch, jobs=1, root=paths.cache_dir() / "exports",
                                       baseline=spec.baseline)
    hashes = {}
    for name, path in libraries.items():
        shutil.copyfile(path, out / name)
        hashes[name] = runtime.sha256_file(out / name)
    lib = binding.library(fam.FAMILY)
    shutil.copyfile(lib, out / lib.name)
    return {
        "identity": {**runtime.identity(), "arch": arch, "nvcc": toolkit.nvcc_version(), "compiler": compiler()},
        "binding": {"file": lib.name, "sha256": runtime.sha256_file(out / lib.name)},
        "libraries": hashes,
        "bound": placed,
    }


def compiler() -> str:
    """The first line of the C++ compiler's --version (what built the binding)."""
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return cxx
    return out.splitlines()[0].strip() if out else cxx


def toolchain_missing() -> str | None:
    """Why sources cannot be built here (no nvcc, no C++ compiler), or None."""
    try:
        toolkit.cuda_home()
    except TunerError as exc:
        return str(exc)
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx}) on PATH"
    return None
