"""`tuner show`, `list`, `export-best`, `report` and `dashboard`: what the stored studies hold."""

from __future__ import annotations

import argparse
import json
import shlex

from tuner import paths
from tuner.cli import target as cli_target
from tuner.errors import TunerError, UsageError


def _show(st, k: int) -> str:
    from tuner.store import study, trials

    space = study.family_of(st).space_for(st.user_attrs.get("problem", {}))
    frame = trials.trials_frame(st, space)
    lines = [f"study {st.study_name}"]
    gpu = st.user_attrs.get("gpu", {})
    if gpu:
        lines.append("  gpu: " + ", ".join(f"{key} {gpu[key]}" for key in
                                           ("gpu_name", "arch", "driver", "torch", "cuda") if gpu.get(key)))
    if frame.empty:
        return "\n".join(lines + ["  no trials yet"])
    counts = frame["state"].value_counts().to_dict()
    reasons = frame.loc[frame["state"] == "FAIL", "reason"].value_counts().to_dict()
    lines.append(f"  trials: {counts}; failures by reason: {reasons or 'none'}")
    best = trials.top(frame, k)
    if best.empty:
        return "\n".join(lines + ["  no verified variant yet"])
    cols = [d.name for d in space.dims] + ["objective_us", "fwd_us", "fwd_spread_us", "bwd_us", "bwd_spread_us",
                                          "regs_fwd", "regs_bwd", "spill_bytes"]
    lines.append(f"\ntop {len(best)} in the search:")
    lines.append(best[[c for c in cols if c in best]].round(2).to_string(index=False))
    retimed = st.user_attrs.get("retimed")
    if retimed:
        import pandas as pd

        rows = [{"variant": r["variant"], "objective_us": r["objective_us"],
                 "fwd_us": r["fwd"]["median_us"], "fwd_spread_us": r["fwd"]["spread_us"],
                 **({"bwd_us": r["bwd"]["median_us"], "bwd_spread_us": r["bwd"]["spread_us"]} if "bwd" in r else {})}
                for r in retimed]
        lines.append("\nre-timed, interleaved (the winner is the first):")
        lines.append(pd.DataFrame(rows).round(2).to_string(index=False))
    baseline = st.user_attrs.get("baseline")
    if baseline and retimed:  # timed in the same turns (tuner.search.finalists)
        from tuner.store.records import served_by

        times = ", ".join(f"{k} {baseline[k]['median_us']:.2f} us" for k in ("fwd", "bwd") if k in baseline)
        who = served_by(retimed[0], baseline, st.user_attrs.get("objective") or "fwd+bwd")
        lines.append(f"\nbaseline, the torch op, timed with them: {times}; the export serves this problem with "
                     + ("the winner" if who == "variant" else "torch's op (the winner did not beat it)"))
    rejected = st.user_attrs.get("rejected") or {}
    if rejected:  # finalists whose whole build failed the check of every mode (tuner.search.finalists)
        lines.append(f"\nfinalists rejected by their whole check ({len(rejected)}), never exported:")
        lines += [f"  {name}: {why[:200]}" for name, why in rejected.items()]
    done = frame[frame["state"] == "COMPLETE"]
    lines.append(f"\nmedian objective of all {len(done)} verified trials: {done['objective_us'].median():.2f} us")
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> int:
    from tuner.store import journal
    from tuner.store import study, trials

    if args.export is not None:
        return _show_export(args)
    st = study.load(cli_target.study_name(args), args.storage)
    if args.json:
        space = study.family_of(st).space_for(st.user_attrs.get("problem", {}))
        frame = trials.trials_frame(st, space)
        print(json.dumps({"study": st.study_name, "attrs": st.user_attrs,
                          "trials": json.loads(frame.to_json(orient="records"))}, indent=1, default=str))
    else:
        print(_show(st, args.top_k))
        skipped = journal.damaged_lines(st._storage)
        if skipped:
            print(f"damaged records skipped: {len(skipped)} (lines {_spans(skipped)} of {study.storage_url(args.storage)})")
    return 0


def _show_export(args: argparse.Namespace) -> int:
    """`tuner show --export DIR`: what `export-best` said of the export, read back from its manifest,
    with each dtype pair's word on what serves it."""
    from tuner import families
    from tuner.deploy import export

    named = sorted(getattr(args, "options", set()) - cli_target.NAME_FREE - {"--export", "--family"})
    if named:
        raise UsageError(f"--export shows an exported folder; {', '.join(named)} {'name' if len(named) > 1 else 'names'} "
                         "a study: drop one or the other")
    folder = args.export
    if not folder.exists() and len(folder.parts) == 1 and (export.exports_dir() / folder).exists():
        folder = export.exports_dir() / folder  # a name `tuner list` shows
    manifest = export.read(folder)
    if "--family" in getattr(args, "options", set()) and manifest["family"] != args.family:
        raise TunerError(f"{folder} holds the {manifest['family']} family, not {args.family}")
    if args.json:
        print(json.dumps(manifest, indent=1))
        return 0
    name = manifest["family"]
    op = families.part(name, "op") if families.has_part(name, "op") else None
    for line in export_lines(manifest, folder, families.get(name), op, pairs=True):
        print(line)
    return 0


def _spans(lines: list[int]) -> str:
    """1, 2, 3, 7 -> '1-3, 7'."""
    spans: list[list[int]] = []
    for n in lines:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def cmd_list(args: argparse.Namespace) -> int:
    import pandas as pd

    import optuna

    from tuner.deploy import export
    from tuner.store import study

    url = study.storage_url(args.storage)
    st = None if study.absent(url) else study.storage(url)  # opened once: a journal is read as it opens
    rows = []
    for s in ([] if st is None else optuna.get_all_study_summaries(st)):
        best = s.best_trial.value if s.best_trial is not None else None
        # trials as --trials counts them; beside them, those a stopped search left running or failed
        # as interrupted (the next search of the study runs their variants again)
        loaded = optuna.load_study(study_name=s.study_name, storage=st)
        tally, again = study.tally(loaded), study.retried(loaded)
        left = sum(study.interrupted(t) and t.number not in again for t in loaded.get_trials(deepcopy=False))
        rows.append({"study": s.study_name, "trials": tally.done, "unfinished": len(tally.running) + left,
                     "best_us": best, "gpu": s.user_attrs.get("gpu", {}).get("gpu_name", "")})
    if rows:
        print(pd.DataFrame(rows).to_string(index=False))
    else:
        print(f"no studies in {study.shown(url)}" + (" (no such file yet)" if study.absent(url) else ""))
    exported = _exports()
    if exported:
        print(f"\nexports under {export.exports_dir()} (`tuner show --export NAME` prints one):")
        print(pd.DataFrame(exported).to_string(index=False))
    return 0


def _exports() -> list[dict]:
    """The exports `export-best` wrote under $TUNER_HOME/exports, a row each (one it cannot read says why)."""
    from tuner.deploy import export

    rows = []
    folders = sorted(export.exports_dir().glob(f"*/{export.MANIFEST}"))
    for folder in (m.parent for m in folders):
        try:
            m = export.read(folder)
        except TunerError as exc:
            rows.append({"export": folder.name, "family": "", "gpu": "", "problems": "", "by torch": "",
                         "binaries": f"not loadable: {str(exc)[:80]}"})
            continue
        rows.append({"export": folder.name, "family": m["family"], "gpu": m["gpu"].get("gpu_name", ""),
                     "problems": len(m["entries"]), "by torch": sum(e.get("served_by") == "torch" for e in m["entries"]),
                     "binaries": m["binaries"]["identity"]["arch"] if m.get("binaries") else "sources only"})
    return rows


def elsewhere(op, pairs: list[dict] | None = None) -> str | None:
    """What serves the calls near no tuned problem, as the family's OpSpec says (None: no baseline,
    the nearest winner serves every call). `pairs`: the family's dtype pairs (each space's fixed
    dtypes), to say which of them torch does not fuse."""
    if not op.baseline:
        return None
    unfused = [p for p in pairs or [] if op.unfused is not None and op.unfused(p)]
    if pairs and len(unfused) == len(pairs):
        return ("torch's op is unfused for every dtype pair: every shape and pair runs the nearest tuned problem's "
                "parameters, and torch's op serves only the tuned problems where it was faster")
    if op.untuned_by_baseline and op.reach and unfused:
        words = ", ".join("/".join(map(str, p.values())) for p in unfused)
        return ("dtype pairs and shapes far from every tuned problem are served by torch's op, but the pairs torch "
                f"does not fuse ({words}) run the nearest tuned problem's parameters at every shape")
    if op.untuned_by_baseline and op.reach:
        return "dtype pairs and shapes far from every tuned problem are served by torch's op"
    if op.untuned_by_baseline:
        return "untuned dtype pairs are served by torch's op; other shapes run the nearest tuned problem's variant"
    if op.reach:
        return ("shapes far from every tuned problem of their dtype pair are served by torch's op; untuned dtype "
                "pairs run the nearest tuned problem's parameters")
    return "other shapes and dtype pairs run the nearest tuned problem's parameters (torch's op serves only where it won)"


def cmd_export_best(args: argparse.Namespace) -> int:
    from tuner.deploy import best

    if args.wheel and args.sources_only:
        raise UsageError("--wheel packs the export's binaries, and --sources-only leaves them out: drop one")
    label, loaded = best.studies(args.family, args.storage, study=args.study, gpu=args.gpu)  # the studies, read once
    done = best.export_best(label, loaded, args.out, binaries=not args.sources_only, check=not args.no_check,
                            wheel=args.wheel)
    for note in done.notes:
        print(note)
    for line in export_lines(done.manifest, done.out, done.family, done.op):
        print(line)
    print(f'load it with: op = tuner.load("{done.out}")')
    if done.wheel is not None:
        print(f"wheel: {done.wheel} ({done.wheel.stat().st_size / 1e6:.1f} MB); `pip install {done.wheel}`, then "
              f"`import {done.wheel.name.split('-')[0]}` registers torch.ops.tuner.{done.op.OP.op}")
    return 0


def export_lines(manifest: dict, out, family, op, pairs: bool = False) -> list[str]:
    """What an export holds, a line each: every tuned problem and what serves it, the shapes its
    check measured around them, what serves calls near none of them (`pairs`: the manifest's word for
    each dtype pair, else one line) and the binaries' setup."""
    describe = cli_target.cli_part(manifest["family"]).describe
    lines = [f"{describe(e['problem'])}: {_served(e)}" for e in manifest["entries"]]
    lines += region_lines(manifest.get("regions") or [], describe)
    by_torch = sum(e.get("served_by") == "torch" for e in manifest["entries"])
    lines.append(f"exported {len(manifest['entries'])} tuned problem(s) for {manifest['gpu'].get('gpu_name')} to {out}"
                 + (f"; torch's op serves {by_torch} of them, where no variant beat it" if by_torch else ""))
    if pairs and manifest.get("serving"):
        lines.append("each dtype pair, at shapes near no tuned or measured one:")
        lines += [f"  {pair}: {words}" for pair, words in manifest["serving"].items()]
    else:
        untuned = elsewhere(op.OP, [space.fixed for space in family.all_spaces()]) if op else None
        lines += [untuned] if untuned else []
    if manifest.get("binaries"):
        b = manifest["binaries"]["identity"]
        lines.append(f"binaries for {b['arch']}, torch {b['torch']}, CUDA {b['cuda']}, Python {b['python']} "
                     "(loaded without a toolchain where these match)")
    return lines


def region_lines(regions: list[dict], describe) -> list[str]:
    """The shapes the export's check measured around its tuned problems (the manifest's `regions`,
    tuner.deploy.regions), a line each: who serves calls nearest to it, and the op's slowest cell
    against torch's op there."""
    if not regions:
        return []
    lines = [f"measured around them ({len(regions)} shapes; a call is served as the nearest measured or tuned shape):"]
    for r in regions:
        every = r.get("checked") or {}
        cells = {k: v for k, v in every.items() if v is not None}
        worst = max(cells.items(), key=lambda kv: kv[1], default=None)
        parts = [f"op / torch's op at most {worst[1]:.2f}x, {worst[0]}"] if worst else []
        if len(every) > len(cells):
            parts.append(f"{len(every) - len(cells)} cell(s) not timed")
        against = f" ({'; '.join(parts)})"
        lines.append(f"  {describe(r['problem'])}: {_who(r)}{against}")
    return lines


def _served(entry: dict) -> str:
    """One problem of an export: its winner and time, beside the baseline's where it was timed."""
    timing = (f"{entry['objective']} {entry['objective_us']:.2f} us" if entry.get("objective_us") is not None
              else "not timed")
    base = entry.get("baseline_us")
    if base:
        objective = entry.get("objective") or "fwd+bwd"
        from tuner.store.records import objective_value

        timing += f", torch {objective_value(base, objective):.2f} us"
    checked = entry.get("checked")
    if checked:  # the op itself against torch's (tuner.deploy.serving)
        timing += "; op/torch " + ", ".join(f"{cell} {'-' if r is None else f'{r:.2f}x'}" for cell, r in checked.items())
    if entry.get("served_by") == "torch":
        return f"torch's op (the best variant, {entry['variant']}, {timing})"
    return f"{_who(entry, entry['variant'])} ({timing})"


def _who(verdict: dict, variant: str = "a variant") -> str:
    """Who serves a checked shape, in words (`variant`: what to call its variant): each kind of
    call's, where torch's op won one (tuner.deploy.regions.verdict)."""
    if verdict.get("served_by") == "torch":
        return "torch's op"
    other = {"inference": "training", "training": "inference"}.get(verdict.get("torch_serves"))
    if other is None:
        return variant
    return f"{variant} for {other} calls, torch's op for {verdict['torch_serves']} calls"


def cmd_report(args: argparse.Namespace) -> int:
    from tuner.report import report
    from tuner.store import study

    st = study.load(cli_target.study_name(args), args.storage)
    out = args.out or paths.reports_dir() / study.plain_name(st.study_name)  # made once the study is read
    importance = report.report(st, out)
    print(f"study {st.study_name}: {len(st.trials)} trials")
    if importance:
        print("parameter importance (PED-ANOVA):")
        for name, value in importance.items():
            print(f"  {name:<18} {value:.3f}")
    if (out / "by_dimension.md").exists():
        print("\nby dimension (registers, spills, occupancy of the best trial of each value):")
        print((out / "by_dimension.md").read_text())
    print(f"wrote {out}/trials.csv, importance.json, by_dimension.csv/.md, time_by_dimension.png, "
          "time_vs_registers.png")
    print(f"browse the study: tuner dashboard --storage {shlex.quote(study.shown(study.storage_url(args.storage)))}")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from tuner.store import study

    try:
        import optuna_dashboard
    except ImportError:
        raise TunerError("the dashboard is a separate package: pip install optuna-dashboard") from None
    url = study.storage_url(args.storage)
    if study.absent(url):
        raise TunerError(f"no studies in {study.shown(url)}: no such file (a search makes it)")
    storage = study.storage(url)
    print(f"optuna-dashboard on http://{args.host}:{args.port}/ for {study.shown(url)} (Ctrl-C stops it)", flush=True)
    optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    return 0
