"""`tuner` command line: one function per command, shared flags from parent parsers."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Callable

from tuner import gpus
from tuner.errors import TunerError

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


STORAGE_HELP = ("where studies live: a journal file's path, journal+postgresql://USER@HOST/DB, or an Optuna RDB "
                "URL such as postgresql+psycopg://USER@HOST/DB (default: studies/tuner.journal)")


def command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    COMMANDS[fn.__name__.removeprefix("cmd_").replace("_", "-")] = fn
    return fn


def _target_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--gpu", help="GPU name (L4, A100, H100, T4, ...) or 'auto' for the attached one")
    p.add_argument("--arch", help="architecture such as sm_89; overrides --gpu")
    return p


def _family_parser() -> argparse.ArgumentParser:
    from tuner import families

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--family", default=families.DEFAULT, choices=families.names(),
                   help=f"kernel family (default {families.DEFAULT})")
    return p


def _cli(args):
    """The family's command-line part (its options, spaces, problem and bench)."""
    from tuner import families

    return families.part(args.family, "cli")


def _spread(variants: list, limit: int | None) -> list:
    """`limit` variants spread over the space (a fixed shuffle, so reruns pick the same ones)."""
    if not limit or limit >= len(variants):
        return variants
    picked = list(variants)
    random.Random(0).shuffle(picked)
    return picked[:limit]


@command
def cmd_variants(args: argparse.Namespace) -> int:
    import pandas as pd

    arch = gpus.resolve(args.gpu, args.arch)
    rows = []
    for space in _cli(args).spaces(args):
        for v in space:
            rows.append({"name": v.name, **v.as_dict()})
    if args.json:
        print(json.dumps({"arch": arch, "count": len(rows), "variants": rows}, indent=1))
        return 0
    table = pd.DataFrame(rows).drop(columns=["name"])
    # opt-in and test-only dimensions say nothing while every row has the same off value
    table = table.drop(columns=[c for c in table if table[c].isna().all()
                                or (table[c].dtype == bool and not table[c].any())])
    print(f"{len(rows)} valid variants for {arch}")
    shown = table if args.limit == 0 else table.head(args.limit)
    print(shown.to_string(index=False))
    if len(shown) < len(table):
        print(f"... {len(table) - len(shown)} more (--limit 0 shows all, --json for machine-readable output)")
    return 0


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@command
def cmd_build(args: argparse.Namespace) -> int:
    import pandas as pd

    from tuner import build, families

    arch = gpus.resolve(args.gpu, args.arch)
    if args.covering:
        variants = families.get(args.family).covering_set()
    else:
        variants = _spread([v for s in _cli(args).spaces(args) for v in s], args.limit)
    started, cpu = time.monotonic(), _children_cpu_s()
    results = build.build(variants, arch, jobs=args.jobs)
    wall, cpu = time.monotonic() - started, _children_cpu_s() - cpu
    rows = [{
        "variant": b.variant.name, "ok": b.ok, "cached": b.cached, "unit": b.unit_size,
        "compile_s": round(b.compile_s, 2),
        "regs_fwd": b.regs("forward") or "", "regs_bwd": b.regs("backward") or "", "spill_bytes": b.spill_bytes,
        "smem_bytes": b.smem_bytes,
    } for b in results]
    if args.json:
        print(json.dumps({"arch": arch, "wall_s": wall, "builds": [b.summary() for b in results]}, indent=1))
    else:
        print(pd.DataFrame(rows).to_string(index=False))
    fresh = [b for b in results if not b.cached]
    failed = [b for b in results if not b.ok]
    units = len({b.so for b in fresh if b.ok})
    per_variant = f"{cpu / len(fresh):.2f} s of one core a variant (nvcc's CPU time), " if fresh else ""
    print(f"\n{len(results)} variants for {arch}: {len(fresh)} compiled ({units} libraries), "
          f"{len(results) - len(fresh)} cached, {len(failed)} failed; {per_variant}wall {wall:.1f} s "
          f"on {args.jobs or os.cpu_count()} cores", file=sys.stderr)
    for b in failed:
        print(f"\nFAILED {b.variant.name}:\n{b.error}", file=sys.stderr)
    return 1 if failed else 0


def _study_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--objective", default="fwd+bwd", choices=("fwd", "bwd", "fwd+bwd"))
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument("--study", help="study name (default: family-GPU-problem-objective)")
    return p


def _problem(args):
    return _cli(args).problem(args)


def _study_name(args) -> str:
    from tuner import study

    if args.study:
        return args.study
    if not args.gpu:
        raise TunerError("name the study with --study, or give --gpu and the problem options")
    gpu = args.gpu
    if gpu.lower() == "auto":
        gpu = gpus.short_name(gpus.attached())
    return study.study_name(args.family, gpu, _problem(args).key(), args.objective)


@command
def cmd_search(args: argparse.Namespace) -> int:
    from tuner import search, study

    started = time.monotonic()
    if not args.gpu:
        raise TunerError("name the GPU to tune for: --gpu L4, --gpu H100, ... or --gpu auto")
    cfg = search.SearchConfig(
        gpu=args.gpu, problem=_problem(args), trials=args.trials, timeout=args.timeout, sampler=args.sampler,
        storage=args.storage, study=args.study, objective=args.objective, simulate=args.simulate,
        simulate_delay=args.simulate_delay,
        import_records=args.import_records,
        plant_faults=tuple(f for f in (args.plant_faults or "").split(",") if f),
        arch=args.arch, jobs=args.jobs, batch=args.ask_batch, top_k=args.top_k, eval_timeout=args.eval_timeout,
        seed=args.seed, progress=not args.quiet, prune=args.prune or None, devices=args.devices)
    report = search.run(cfg)
    st = study.load(report.study_name, args.storage)
    print(_show(st, args.top_k))
    total = report.compile_s + report.verify_s + report.time_s
    share = (lambda x: f"{100 * x / total:.0f}%") if total else (lambda x: "-")
    rate = 60 * report.trials / report.wall_s if report.wall_s else 0.0
    since_start = time.monotonic() - started
    variants = report.evaluated + report.failed.get("compile error", 0)
    print(f"\nthis run: {variants} variants compiled, verified and timed or pruned ({report.pruned} pruned, "
          f"{sum(report.failed.values())} failed) in {since_start:.1f} s from the command's start: "
          f"{60 * variants / since_start:.0f} variants/min")
    print(f"{report.trials} trials in {report.wall_s:.1f} s of search ({rate:.0f}/min), "
          f"{report.evaluated} evaluated, {report.compiled} compiled, {report.duplicates} duplicates, "
          f"failures {report.failed or 'none'}, worker restarts {report.worker_restarts} "
          f"({report.worker_kills} killed from outside, their variants run again), "
          f"re-queued after a kill {len(report.requeued)}, imported {report.imported}")
    print(f"time: compile {report.compile_s:.1f} s ({share(report.compile_s)}), verify {report.verify_s:.1f} s "
          f"({share(report.verify_s)}), timing {report.time_s:.1f} s ({share(report.time_s)})")
    print(f"measurements: {report.records_path}")
    return 0


def _show(st, k: int) -> str:
    from tuner import study

    space = study.family_of(st).space_for(st.user_attrs.get("problem", {}))
    frame = study.trials_frame(st, space)
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
    best = study.top(frame, k)
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
    done = frame[frame["state"] == "COMPLETE"]
    lines.append(f"\nmedian objective of all {len(done)} verified trials: {done['objective_us'].median():.2f} us")
    return "\n".join(lines)


@command
def cmd_show(args: argparse.Namespace) -> int:
    from tuner import study

    st = study.load(_study_name(args), args.storage)
    if args.json:
        space = study.family_of(st).space_for(st.user_attrs.get("problem", {}))
        frame = study.trials_frame(st, space)
        print(json.dumps({"study": st.study_name, "attrs": st.user_attrs,
                          "trials": json.loads(frame.to_json(orient="records"))}, indent=1, default=str))
    else:
        print(_show(st, args.top_k))
    return 0


@command
def cmd_list(args: argparse.Namespace) -> int:
    import pandas as pd

    from tuner import study

    rows = []
    for s in study.summaries(args.storage):
        best = s.best_trial.value if s.best_trial is not None else None
        rows.append({"study": s.study_name, "trials": s.n_trials, "best_us": best,
                     "gpu": s.user_attrs.get("gpu", {}).get("gpu_name", "")})
    if not rows:
        print(f"no studies in {study.storage_url(args.storage)}")
        return 0
    print(pd.DataFrame(rows).to_string(index=False))
    return 0


@command
def cmd_export_best(args: argparse.Namespace) -> int:
    from tuner import export, families, study

    if args.study:
        names = [args.study]
        label = args.gpu or study.load(args.study, args.storage).user_attrs.get("gpu", {}).get("gpu_name", "gpu")
    elif args.gpu:
        label = args.gpu
        if label.lower() == "auto":
            label = gpus.short_name(gpus.attached())
        names = export.studies_for(label, args.family, args.storage)
        if not names:
            raise TunerError(f"no studies for {label} in {study.storage_url(args.storage)}; "
                             f"run `tuner search --gpu {args.gpu}` first")
    else:
        raise TunerError("say what to export: --gpu H100 (all its studies) or --study NAME")
    out = export.export(names, args.out or export.default_dir(label, args.family), args.storage,
                        binaries=not args.sources_only)
    manifest = export.read(out)
    describe = families.part(manifest["family"], "cli").describe
    for e in manifest["entries"]:
        print(f"{describe(e['problem'])}: {e['variant']} ({e['objective']} {e['objective_us']:.2f} us)")
    print(f"exported {len(manifest['entries'])} tuned variant(s) for {manifest['gpu'].get('gpu_name')} to {out}")
    if manifest.get("binaries"):
        b = manifest["binaries"]["identity"]
        print(f"binaries for {b['arch']}, torch {b['torch']}, CUDA {b['cuda']}, Python {b['python']} "
              "(loaded without a toolchain where these match)")
    print(f'load it with: op = tuner.load("{out}")')
    if args.wheel:
        from tuner import wheel

        path = wheel.write(out, args.wheel, gpu_label=label)
        print(f"wheel: {path} ({path.stat().st_size / 1e6:.1f} MB); `pip install {path}`, then "
              f"`import {path.name.split('-')[0]}` registers torch.ops.tuner.{families.part(manifest['family'], 'op').OP.op}")
    return 0


@command
def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from tuner import deploy

    attached = gpus.attached()
    if args.gpu and not attached.matches(args.gpu):
        raise TunerError(f"--gpu {args.gpu} was asked for, but the attached GPU is {attached.name}")
    directory = args.artifact or deploy.find_export(args.gpu or "auto", args.family)
    info = attached.describe()
    print(f"# {info['gpu_name']} ({info['arch']}), driver {info['driver']}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}")
    _cli(args).bench(directory, args)
    print(f"wrote {args.out}/bench.csv, bench.md, bench.png")
    return 0


@command
def cmd_report(args: argparse.Namespace) -> int:
    from tuner import report, study

    st = study.load(_study_name(args), args.storage)
    out = args.out or Path("reports") / st.study_name
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
    print(f"browse the study: tuner dashboard --storage {study.storage_url(args.storage)}")
    return 0


@command
def cmd_dashboard(args: argparse.Namespace) -> int:
    from tuner import study

    try:
        import optuna_dashboard
    except ImportError:
        raise TunerError("the dashboard is a separate package: pip install optuna-dashboard") from None
    print(f"optuna-dashboard on http://{args.host}:{args.port}/ for {study.storage_url(args.storage)} "
          "(Ctrl-C stops it)", flush=True)
    optuna_dashboard.run_server(study.storage(args.storage), host=args.host, port=args.port)
    return 0


@command
def cmd_samplers(args: argparse.Namespace) -> int:
    from tuner import quality, search

    names = [n for n in args.samplers.split(",") if n]
    unknown = [n for n in names if n not in search.SAMPLERS]
    if unknown or not names:
        raise TunerError(f"--samplers: unknown {unknown or 'none given'}; known: {', '.join(search.SAMPLERS)}")
    problem = _problem(args)
    best = quality.dataset_best(args.simulate, problem, args.objective)
    size = quality.space_size(problem)
    print(f"{args.simulate}: best {args.objective} {best:.2f} us; a run reaches at <= {best * (1 + args.within):.2f} us "
          f"(within {args.within:.0%}); {size} variants", file=sys.stderr)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started = time.monotonic()
    table = quality.sampler_table(
        args.simulate, problem, names, seeds, args.within, args.max_trials, args.objective,
        on_run=lambda name, seed, count: print(f"  {name} seed {seed}: {count or 'not reached'}", file=sys.stderr))
    print(quality.markdown(table), end="")
    print(f"wall {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.csv:
        table.to_csv(args.csv, index=False)
    default = search.SearchConfig.sampler
    if args.fail_above is not None and default in names:
        share = table.loc[table["sampler"] == default, "median % of space"].iloc[0]
        if not share <= args.fail_above:  # NaN (not reached) fails too
            print(f"tuner samplers: {default}'s median is {share}% of the space, above {args.fail_above}%",
                  file=sys.stderr)
            return 1
    return 0


def _family_of(argv: list[str] | None) -> str:
    """--family, read ahead: the other options of a command depend on it."""
    from tuner import families

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--family", default=families.DEFAULT)
    name = pre.parse_known_args(argv)[0].family
    return name if name in families.names() else families.DEFAULT  # an unknown one: argparse says so


def parser(family: str | None = None) -> argparse.ArgumentParser:
    from tuner import families

    fam = families.part(family or families.DEFAULT, "cli")
    p = argparse.ArgumentParser(prog="tuner", description="Tune CUDA kernel variants of PyTorch ops.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    target, family_opt = _target_parser(), _family_parser()
    dtypes = argparse.ArgumentParser(add_help=False)
    fam.add_space_args(dtypes)

    s = sub.add_parser("variants", parents=[family_opt, target, dtypes], help="list the valid variants")
    s.add_argument("--json", action="store_true")
    s.add_argument("--limit", type=int, default=40, help="rows to print (0: all)")

    s = sub.add_parser("build", parents=[family_opt, target, dtypes], help="compile variants (no GPU needed)")
    s.add_argument("--limit", type=int, help="build this many variants, spread over the space")
    s.add_argument("--jobs", type=int, help="parallel compiles (default: all cores)")
    s.add_argument("--covering", action="store_true",
                   help="the covering set: every value of every dimension, every dtype pair")
    s.add_argument("--json", action="store_true")
    problem = argparse.ArgumentParser(add_help=False)
    fam.add_problem_args(problem)
    problem = [family_opt, target, problem, _study_parser()]
    s = sub.add_parser("search", parents=problem, help="search for the fastest correct variant")
    s.add_argument("--trials", type=int, default=200, help="finished trials the study should reach")
    s.add_argument("--timeout", type=float, help="stop asking for new trials after this many seconds")
    s.add_argument("--sampler", default="tpe", choices=("tpe", "random", "grid"))
    s.add_argument("--simulate", type=Path, metavar="FILE",
                   help="replay recorded measurements (a search's .jsonl) instead of using a GPU")
    s.add_argument("--simulate-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    s.add_argument("--jobs", type=int, help="parallel compiles (default: all cores)")
    s.add_argument("--ask-batch", type=int, help="trials asked of Optuna and compiled together")
    s.add_argument("--top-k", type=int, default=5, help="finalists re-timed at the end")
    s.add_argument("--eval-timeout", type=float, default=60.0, help="seconds before a variant counts as hung")
    s.add_argument("--devices", metavar="all|0,1,...",
                   help="GPUs of this host that evaluate variants, a worker each, fed from one study and one "
                        "compile pipeline (default: device 0); all must be the --gpu model")
    s.add_argument("--prune", type=float, default=1.5, metavar="FACTOR",
                   help="stop timing a verified variant whose first repetitions are FACTOR x slower than the "
                        "best so far (recorded as PRUNED); 0 times every variant in full")
    s.add_argument("--seed", type=int)
    s.add_argument("--import-records", type=Path, metavar="FILE",
                   help="count the measurements in FILE (same GPU, problem and objective) as finished trials")
    s.add_argument("--plant-faults", metavar="KINDS",
                   help="test only: also evaluate variants with planted faults, e.g. oob,assert,hang "
                        "(compile, oob, assert, hang, wrong, nan, resources)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")

    s = sub.add_parser("show", parents=problem, help="print a stored study")
    s.add_argument("--json", action="store_true")
    s.add_argument("--top-k", type=int, default=10)

    s = sub.add_parser("export-best", parents=[family_opt, target], help="export the winners of a GPU's studies")
    s.add_argument("--study", help="export this study only")
    s.add_argument("--out", type=Path, help="artifact folder (default: exports/<family>-<GPU> under $TUNER_HOME)")
    s.add_argument("--storage", help=STORAGE_HELP)
    s.add_argument("--wheel", type=Path, metavar="DIR",
                   help="also write a pip-installable wheel of the export into DIR (needs torch alone)")
    s.add_argument("--sources-only", action="store_true",
                   help="write sources only, no binaries (loading then builds them)")

    s = sub.add_parser("bench", parents=[family_opt, target], help="time the tuned op against what users run today")
    s.add_argument("--artifact", type=Path, help="exported folder (default: the attached GPU's export)")
    fam.add_bench_args(s)
    s.add_argument("--out", type=Path, default=Path("bench-results"))

    s = sub.add_parser("report", parents=problem, help="CSV, importances and plots of a study")
    s.add_argument("--out", type=Path, help="folder (default: reports/<study>)")

    sizes = argparse.ArgumentParser(add_help=False)
    fam.add_problem_args(sizes)
    s = sub.add_parser("samplers", parents=[family_opt, sizes],
                       help="search quality in simulation: trials each sampler needs to find a near-best variant")
    s.add_argument("--simulate", type=Path, metavar="FILE", required=True,
                   help="a recording of the whole space (a search's .jsonl)")
    s.add_argument("--samplers", default="tpe,random,grid", help="comma-separated (default: all)")
    s.add_argument("--seeds", type=int, default=20, help="runs per sampler (default 20)")
    s.add_argument("--first-seed", type=int, default=0, help="seeds run from this one up (default 0)")
    s.add_argument("--within", type=float, default=0.03,
                   help="a run ends at a variant within this fraction of the recording's best (default 0.03)")
    s.add_argument("--max-trials", type=int, help="give up after this many trials (default: the size of the space)")
    s.add_argument("--objective", default="fwd+bwd", choices=("fwd", "bwd", "fwd+bwd"))
    s.add_argument("--csv", type=Path, help="also write the table here")
    s.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit 1 when the default sampler's (tpe) median is above PCT %% of the space")

    s = sub.add_parser("list", help="list stored studies")
    s.add_argument("--storage", help=STORAGE_HELP)

    s = sub.add_parser("dashboard", help="Optuna's dashboard on a storage (pip install optuna-dashboard)")
    s.add_argument("--storage", help=STORAGE_HELP)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser(_family_of(argv)).parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except TunerError as exc:
        if args.debug:
            raise
        print(f"tuner {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"tuner {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
