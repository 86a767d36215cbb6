"""`tuner export-best`: the winners of a GPU's studies as a self-checking artifact.

An artifact is a folder: the rendered CUDA source of each winner (one per tuned
problem: dtype pair and shape), the ABI header, the binaries built for the study's GPU
(the family's torch binding and a library of the variants its op binds; tuner/deploy/binaries.py),
and `manifest.json` with where and how it was measured, the build identity, and a SHA-256
of every source, every binary and of the manifest itself, so that `tuner.load` and the
runtime refuse an artifact that was edited. Where the identity matches, loading needs no
toolchain; elsewhere the sources are built.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import warnings
from pathlib import Path
from typing import Any

from tuner import families, paths, runtime
from tuner.version import __version__
from tuner.deploy import binaries as _binaries
from tuner.deploy import regions as _regions
from tuner.store import study as studies
from tuner.store import trials
from tuner.errors import TunerError
from tuner.store.records import served_by
from tuner.build.render import header_text, headers, render, templates_dir
from tuner.variant import Variant

MANIFEST = runtime.MANIFEST
FORMAT = 2  # 2: binaries beside the sources; format 1 (sources only) still loads
FORMATS = (1, 2)
manifest_checksum = runtime.manifest_checksum
problem_key = _binaries.problem_key


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def exports_dir() -> Path:
    """$TUNER_HOME/exports: where `export-best` writes by default and `tuner list` looks."""
    return paths.home() / "exports"


def default_dir(gpu: str, family: str) -> Path:
    """Where `export-best` writes and `tuner.load(gpu=...)` looks: exports/<family>-<GPU>."""
    return exports_dir() / (family + "-" + re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-"))


class NoTrial(TunerError):
    """A study that holds no verified trial (a search stopped before its first)."""


def _winner(st) -> dict[str, Any]:
    """The study's re-timed winner, else its best verified trial (planted faults never)."""
    problem = st.user_attrs.get("problem")
    if not problem:
        raise TunerError(f"study {st.study_name!r} was not made by `tuner search` (no problem recorded)")
    family = studies.family_of(st)
    space = family.space_for(problem)
    frame = trials.trials_frame(st, space)
    best = trials.top(frame, 1)
    if best.empty:
        raise NoTrial(f"study {st.study_name!r} has no verified trial to export; run `tuner search` first")
    row = best.iloc[0]
    by_name = space.by_name()
    winner = st.user_attrs.get("winner")
    variant = None
    halves = (winner or {}).get("halves")
    if halves and halves["forward"] in by_name and halves["backward"] in by_name:
        # the best forward and best backward joined (tuner.search.finalists): checked and timed as one
        variant = Variant.joined(by_name[halves["forward"]], by_name[halves["backward"]])
    elif winner and winner["variant"] in by_name:
        variant = by_name[winner["variant"]]
    if variant is not None:
        timings = {k: winner[k] for k in ("fwd", "bwd") if k in winner}
        objective = winner["objective_us"]
        retimed = True
    elif getattr(family, "FINALISTS_WHOLE", False):
        # its trials were checked in the problem's mode alone: only a finalist checked whole ships
        raise TunerError(f"study {st.study_name!r} has no winner checked in full yet (its search stopped before "
                         f"its finalists): run the same `tuner search` again to finish it, then export")
    else:
        variant = by_name[row["variant"]]
        timings = {"fwd": {"median_us": row["fwd_us"], "spread_us": row["fwd_spread_us"]}}
        if row["bwd_us"] == row["bwd_us"] and row["bwd_us"] is not None:
            timings["bwd"] = {"median_us": row["bwd_us"], "spread_us": row["bwd_spread_us"]}
        objective = float(row["objective_us"])
        retimed = False
        # a search stopped before its finalists (Ctrl-C, a kill), or none passed: said aloud
        warnings.warn(f"study {st.study_name!r} has no re-timed winner (its search stopped before its finalists, or "
                      f"none passed): exporting its best of {len(frame)} verified trials as the search timed it; run "
                      "the same `tuner search` again to finish it", UserWarning, stacklevel=3)
    fwd, bwd = variant.halves() or (variant, variant)  # a joined variant's errors: its forward's and its backward's trial
    baseline = st.user_attrs.get("baseline") if retimed else None  # timed beside the finalists
    objective_name = st.user_attrs.get("objective") or "fwd+bwd"
    return {"variant": variant, "problem": problem, "timings": timings, "objective_us": objective,
            "retimed": retimed, "objective": st.user_attrs.get("objective"), "study": st.study_name,
            "baseline_us": baseline, "served_by": served_by(timings, baseline, objective_name),
            "verification": {"loss_error": _fact(st, fwd, "loss_error"), "grad_error": _fact(st, bwd, "grad_error")}}


def _fact(st, variant: Variant, key: str):
    trial = next(t for t in st.get_trials(deepcopy=False) if t.user_attrs.get("variant") == variant.name
                 and t.state.name == "COMPLETE")
    return studies.facts(trial).get(key)


SLOWER = _regions.SLOWER  # a checked problem slower than torch's op by more than this in a cell goes to torch


def export(study_names: list[str], out: Path, storage: str | None = None, binaries: bool = True,
           checked: dict[str, dict] | None = None, regions: list[dict] | None = None) -> Path:
    """Write the artifact for these studies (all of one GPU) into `out`. `checked`: the op's ratios
    to torch's per cell at its problems (tuner.deploy.serving, by problem key): a problem slower in any is
    served by torch's op. `regions`: the shapes measured around them, with who serves each
    (tuner.deploy.regions.decide)."""
    winners, gpu = gather(study_names, storage)
    apart = _regions.kinds_apart(winners[0]["variant"].family)
    return write(out, with_checks(winners, checked, apart), gpu, binaries, regions or [])


def gather(study_names: list[str], storage: str | None = None) -> tuple[list[dict[str, Any]], dict]:
    """(the studies' winners, the GPU they were measured on): what an export writes, read once."""
    if not study_names:
        raise TunerError("no studies to export: run `tuner search` first, or name one with --study")
    return winners_of([studies.load(name, storage) for name in study_names])


def winners_of(loaded: list) -> tuple[list[dict[str, Any]], dict]:
    """(the winners of these loaded studies, the GPU they were measured on). A study without a
    verified trial is left out, with a warning, where others have winners: one search stopped at
    once does not keep the GPU's other problems from their export."""
    gpus = {json.dumps(st.user_attrs.get("gpu", {}), sort_keys=True) for st in loaded}
    if len(gpus) > 1:
        raise TunerError("these studies were measured on different GPUs; export one GPU at a time (--study)")
    winners, empty = [], []
    for st in loaded:
        try:
            winners.append(_winner(st))
        except NoTrial as exc:
            empty.append((st.study_name, exc))
    if not winners:
        raise empty[0][1]
    for name, _ in empty:
        warnings.warn(f"study {name!r} has no verified trial: left out of the export", UserWarning, stacklevel=2)
    return winners, json.loads(gpus.pop())


def with_checks(winners: list[dict[str, Any]], checked: dict[str, dict] | None,
                apart: bool = True) -> list[dict[str, Any]]:
    """The winners with the op's ratios to torch's at their problems (tuner.deploy.serving), and who
    serves each kind of call there (tuner.deploy.regions.verdict: torch's op where the op was
    slower; `apart`, regions.kinds_apart). A winner its search gave to torch's op stays torch's: the
    check timed the problem's variant-served winner, not it (of two studies of one problem, say)."""
    out = []
    for w in winners:
        cells = (checked or {}).get(problem_key(w["problem"]))
        if cells is not None and w.get("served_by", "variant") != "variant":
            w = {**w, "checked": cells}
        elif cells is not None:
            said = _regions.verdict(cells, SLOWER, apart)
            w = {**{k: v for k, v in w.items() if k != "torch_serves"}, "checked": cells,
                 **(said if said["served_by"] == "torch" or "torch_serves" in said else {})}
        out.append(w)
    return out


def write(out: Path, winners: list[dict[str, Any]], gpu: dict, binaries: bool = True,
          regions: list[dict] = ()) -> Path:
    """Write an artifact: each winner's source, the ABI header, the binaries for the GPU's
    architecture (`binaries=False`: sources only) and the manifest (written last); `regions`, the
    shapes measured around the winners' problems and who serves each (tuner.deploy.regions).
    Everything is written into a folder beside `out` and moved into it at the end, the manifest
    last: an export that fails or is interrupted (a compile, Ctrl-C) leaves nothing in `out`."""
    out = Path(out)
    names = {w["variant"].family for w in winners}
    if len(names) != 1:
        raise TunerError(f"an artifact holds one kernel family; these winners are of {sorted(names)}")
    family = families.get(names.pop())
    with paths.staged(out, last=MANIFEST) as staging:
        _write(staging, family, winners, gpu, binaries, regions)
    return out


def _write(out: Path, family, winners: list[dict[str, Any]], gpu: dict, binaries: bool, regions) -> None:
    entries = []
    for w in winners:
        v: Variant = w["variant"]
        source = render(v)
        filename = f"{v.name}.cu"
        (out / filename).write_text(source)
        entries.append({
            "problem": w["problem"], "variant": v.name, "params": v.as_dict(), "source": filename,
            "source_sha256": sha256(source), "timings_us": w.get("timings", {}), "objective": w.get("objective"),
            "objective_us": w.get("objective_us"), "retimed": w.get("retimed", False), "study": w.get("study"),
            "verification": w.get("verification", {}),
            # the baseline's timings beside the winner's, and who serves the problem (tuner.store.records.served_by)
            "baseline_us": w.get("baseline_us"), "served_by": w.get("served_by", "variant"),
            # the kind of call torch's op serves though a variant serves the other (`verdict`)
            **({"torch_serves": w["torch_serves"]} if w.get("torch_serves") else {}),
            **({"checked": w["checked"]} if "checked" in w else {}),  # the op / torch's op, per cell
        })
    for name, text in headers(family.FAMILY).items():  # the sources include them
        (out / name).write_text(text)
    manifest = {
        "format": FORMAT, "family": family.FAMILY, "tuner": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu, "arch": gpu.get("arch"), "header_sha256": sha256(header_text(family.FAMILY)),
        "template_sha256": sha256((templates_dir(family.FAMILY) / family.TEMPLATE).read_text()),
        "entries": entries,
        **({"regions": list(regions)} if regions else {}),
    }
    spec = families.part(family.FAMILY, "op").OP if families.has_part(family.FAMILY, "op") else None
    built = _binaries.write(out, family, spec, entries, gpu.get("arch"), regions) if binaries else None
    if getattr(family, "OP_DECLARATION", None) is not None:  # who serves each dtype pair, in words, as built
        unbuilt = frozenset(b["unbuilt"] for b in built["bound"] if "unbuilt" in b) if built else frozenset()
        manifest["serving"] = _binaries.serving(family, spec, entries, regions, unbuilt)
    if built:
        manifest["binaries"] = built
    manifest["checksum"] = manifest_checksum(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))


def read(directory: Path) -> dict:
    """The manifest of an artifact, checked: manifest checksum, format, every source's and binary's hash."""
    directory = Path(directory)
    path = directory / MANIFEST
    try:
        manifest = runtime.read_manifest(directory)  # JSON, the manifest's checksum, the binaries' hashes
    except RuntimeError as exc:  # the same message, as the project's own error
        raise TunerError(str(exc)) from None
    if manifest.get("format") not in FORMATS or manifest.get("family") not in families.names():
        raise TunerError(f"{path}: unsupported artifact (format {manifest.get('format')}, "
                         f"family {manifest.get('family')}; installed families: {', '.join(families.names())})")
    if manifest.get("checksum") != manifest_checksum(manifest):
        raise TunerError(f"{path} was edited after export (its checksum does not match); refusing to load it")
    entries = manifest.get("entries")
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise TunerError(f"{path}: its entries are not a list of tuned problems, as an export writes them")
    headers = families.get(manifest["family"]).HEADERS
    try:
        header = "".join((directory / name).read_text() for name in headers)
    except FileNotFoundError as exc:
        raise TunerError(f"artifact {directory} is missing {exc.filename}") from exc
    except (OSError, UnicodeDecodeError):
        raise TunerError(f"artifact {directory}: {', '.join(headers)} cannot be read as text: edited after export; "
                         "refusing to load it") from None
    if sha256(header) != manifest.get("header_sha256"):
        raise TunerError(f"{directory}: {', '.join(headers)} do not match the hash in {MANIFEST}: edited after "
                         "export; refusing to load it")
    for name, expected in [(e.get("source"), e.get("source_sha256")) for e in manifest["entries"]]:
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise TunerError(f"{path}: an entry's source {name!r} is not a file of the export; refusing to load it")
        try:
            text = (directory / name).read_text()
        except FileNotFoundError as exc:
            raise TunerError(f"artifact {directory} is missing {name}") from exc
        except (OSError, UnicodeDecodeError):
            raise TunerError(f"{directory / name} cannot be read as text: edited after export; refusing to load "
                             "it") from None
        if sha256(text) != expected:
            raise TunerError(f"{directory / name} does not match the hash in {MANIFEST}: it was edited "
                             "after export; refusing to load it")
    return manifest
