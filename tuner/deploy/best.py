"""`tuner export-best` in one pass down: the studies read once, the family's parts looked up once,
the export written, timed on the GPU in one process of its own (the op against torch's op at every
problem a variant serves and at shapes around them: tuner.deploy.serving, tuner.deploy.regions),
written again with who serves what, and packed as a wheel if asked. The command prints what
`Exported` holds."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import ModuleType

from tuner import families, gpus, paths
from tuner.deploy import export, regions, serving
from tuner.errors import TunerError
from tuner.store import study as stores


@dataclasses.dataclass
class Exported:
    out: Path
    manifest: dict
    family: ModuleType  # the family's module (its spaces)
    op: ModuleType | None  # its op.py (OP: what serves beyond the tuned problems), None where it has none
    notes: list[str]  # what the check found, a line each
    wheel: Path | None = None


def studies(family: str, storage: str | None, study: str | None = None, gpu: str | None = None
            ) -> tuple[str | None, list]:
    """(the GPU's label, the studies to export, loaded): the one named (its label None where no GPU
    is named: the GPU's name it was measured on), or every study of the family on that GPU ("auto":
    the attached one)."""
    if study:
        return gpu, [stores.load(study, storage)]
    if not gpu:
        raise TunerError("say what to export: --gpu H100 (all its studies) or --study NAME")
    label = gpu
    if label.lower() == "auto":
        label = gpus.short_name(gpus.attached(asked="--gpu auto", hint="; name the GPU (--gpu H100) or the "
                                                                      "study (--study NAME)"))
    names = stores.names_on(family, label, storage)
    if not names:
        raise TunerError(f"no studies for {label} in {stores.shown(stores.storage_url(storage))}; "
                         f"run `tuner search --gpu {gpu}` first")
    return label, [stores.load(name, storage) for name in names]


def export_best(label: str | None, loaded: list, out: Path | None = None, binaries: bool = True,
                check: bool = True, wheel: Path | None = None) -> Exported:
    """Export the winners of `loaded` (studies of one family and GPU) into `out` (default: the GPU's
    export of the family, `label` naming the GPU, else the name it was measured on); with `check`,
    where a GPU of the export's architecture is attached, time the op against torch's op and let
    whichever won serve each problem and the shapes around them."""
    winners, gpu = export.winners_of(loaded)
    label = label or gpu.get("gpu_name", "gpu")
    name = winners[0]["variant"].family
    family = families.get(name)
    op = families.part(name, "op") if families.has_part(name, "op") else None
    out = out or export.default_dir(label, name)
    for folder, what in ((out, "the export's folder"), (wheel, "--wheel")):  # before a minute of compiling
        if folder is not None and not _writable(Path(folder)):
            raise TunerError(f"{what} {folder}: cannot be written here (no write permission, or a read-only place)")
    out = export.write(out, winners, gpu, binaries=binaries)
    notes = []
    if binaries and check:
        why = serving.checkable({"family": name, "arch": gpu.get("arch")})
        if why is None:
            winners, measured, notes = _checked(name, out, winners)
            out = export.write(out, winners, gpu, binaries=binaries, regions=measured)
        elif serving.problems_bench(name) is None:  # nothing would check it on a GPU either
            notes.append(f"not checked at its problems ({why}): its winners were timed against torch's op in the search")
        else:
            notes.append(f"not checked at its problems ({why}): `tuner export-best` on the GPU checks them")
    written = Exported(out, json.loads((out / export.MANIFEST).read_text()), family, op, notes)  # as just written
    if wheel is not None:
        from tuner.deploy import wheel as wheels

        written.wheel = wheels.pack(out, wheel, written.manifest, gpu_label=label)
    return written


def _writable(folder: Path) -> bool:
    """Whether `folder` can be made (where missing) and written: its nearest existing folder's say."""
    import os

    there = paths.nearest_existing(folder)
    return there.is_dir() and os.access(there, os.W_OK | os.X_OK)


def _checked(family: str, out: Path, winners: list[dict]) -> tuple[list[dict], list[dict], list[str]]:
    """The winners with the op's ratios to torch's at their problems (torch's op serving those it
    lost), the shapes measured around them with who serves each, and what was found, in lines. A
    failed timing leaves the export as the search chose it, and says why."""
    served = [{"problem": w["problem"], "served_by": w.get("served_by", "variant")} for w in winners]
    tuned = [{"problem": w["problem"]} for w in served if w["served_by"] == "variant"]
    around = regions.grid(family, served)
    try:
        ratios = serving.measure(out, tuned + around)
    except RuntimeError as exc:
        return winners, [], [f"not checked at its problems: {exc}"]
    checked = {k: ratios[k] for k in (export.problem_key(p["problem"]) for p in tuned) if k in ratios}
    apart = regions.kinds_apart(family)  # each kind of call served apart
    winners = export.with_checks(winners, checked, apart)
    slower = sum(w.get("served_by") == "torch" and "checked" in w for w in winners)
    notes = [f"checked the op against torch's at its {len(checked)} variant-served problems: {slower} slower in "
             "both kinds of call (without a gradient and with one; wall or GPU), now served by torch's op"
             + _kinds_counted(winners)]
    measured = regions.decide(around, ratios, export.SLOWER, apart)
    if measured:
        won = sum(r["served_by"] == "torch" for r in measured)
        notes.append(f"timed the op against torch's at {len(measured)} shapes around and between them: variants "
                     f"serve {len(measured) - won} of them, torch's op {won}" + _kinds_counted(measured)
                     + " (the manifest's regions)")
    return winners, measured, notes


def _kinds_counted(verdicts: list[dict]) -> str:
    """How many verdicts give torch's op one kind of call, the variant the other (`torch_serves`), in
    words ("; 2 give torch's op one kind of call: 1 inference, 1 training"), or ""."""
    kinds = [v["torch_serves"] for v in verdicts if v.get("torch_serves")]  # only ever beside a variant
    if not kinds:
        return ""
    return f"; {len(kinds)} give torch's op one kind of call: " + ", ".join(
        f"{kinds.count(k)} {k}" for k in regions.KINDS if k in kinds)
