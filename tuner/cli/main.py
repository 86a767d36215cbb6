"""`tuner` command line: one function per command, shared flags from parent parsers."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

from tuner import gpus, paths
from tuner.cli import args as cli_args
from tuner.cli import ending
from tuner.cli import problems as cli_problems
from tuner.cli import target as cli_target
from tuner.cli.build import cmd_bench, cmd_build, cmd_variants, compilable
from tuner.cli.samplers import cmd_samplers
from tuner.cli.studies import _show, cmd_dashboard, cmd_export_best, cmd_list, cmd_report, cmd_show
from tuner.errors import TunerError, UsageError
from tuner.search.config import SAMPLERS

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


STORAGE_HELP = ("where studies live: a journal file's path, journal+postgresql://USER@HOST/DB, or an Optuna RDB "
                "URL such as postgresql+psycopg://USER@HOST/DB (default: studies/tuner.journal)")


def command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    COMMANDS[fn.__name__.removeprefix("cmd_").replace("_", "-")] = fn
    return fn


# the commands that live in cli_build, cli_studies and cli_samplers; search registers with @command below
for _fn in (cmd_variants, cmd_build, cmd_show, cmd_list, cmd_export_best, cmd_bench, cmd_report, cmd_dashboard,
            cmd_samplers):
    command(_fn)


def _target_parser(arch: bool = True) -> argparse.ArgumentParser:
    """--gpu, and --arch for the commands that compile for it (variants, build, search); the others
    read studies or exports named by their GPU, where an architecture means nothing."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--gpu", help="GPU name (L4, A100, H100, T4, ...) or 'auto' for the attached one")
    if arch:
        p.add_argument("--arch", help="architecture such as sm_89; overrides --gpu")
    return p


def _family_parser() -> argparse.ArgumentParser:
    from tuner import families

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--family", default=families.DEFAULT, choices=families.names(),
                   help=f"kernel family (default {families.DEFAULT})")
    return p


def _study_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--objective", default="fwd+bwd", choices=("fwd", "bwd", "fwd+bwd"))
    p.add_argument("--storage", type=cli_args.name, help=STORAGE_HELP)
    p.add_argument("--study", type=cli_args.study_name, help="study name (default: family-GPU-problem-objective)")
    return p


def _import_meanwhile(module: str):
    """Import `module` in a thread of its own: a command that needs it at its end imports it while
    it waits (a search on its compilers and GPUs); the caller joins the thread before it exits (an
    import cut off by the interpreter's exit is not left half done). numpy first loads on one BLAS
    thread (the search's ranker: tuner.search.ranking.one_blas_thread)."""
    import importlib
    import threading

    from tuner.search import ranking

    ranking.one_blas_thread()
    thread = threading.Thread(target=importlib.import_module, args=(module,), name=f"tuner-import-{module}",
                              daemon=True)
    thread.start()
    return thread


@command
def cmd_search(args: argparse.Namespace) -> int:
    from tuner import families, paths, search
    from tuner.store import study
    from tuner.measure import worker

    started = time.monotonic()
    if not args.gpu:
        raise UsageError("name the GPU to tune for: --gpu L4, --gpu H100, ... or --gpu auto"
                         + (" (with --simulate: the GPU it was recorded on)" if args.simulate else ""))
    cli_args.recording(args.simulate, "--simulate")
    cli_args.recording(args.import_records, "--import-records")
    if args.simulate and args.arch:
        raise UsageError("--arch: a simulated search replays the recording's GPU and compiles nothing; drop --arch")
    if args.simulate and args.devices is not None:
        raise UsageError("--devices: a simulated search replays a recording and runs on no GPU; drop --devices")
    if args.arch:
        compilable(gpus.check_arch(args.arch))  # before anything is written
    captured = cli_problems.named(args)  # --problems FILE or --dtypes: several problems, else None
    problem = captured[0][0] if captured else cli_target.problem(args)
    faults = tuple(f for f in (args.plant_faults or "").split(",") if f)
    known = families.get(problem.family).FAULTS  # before the study is made: a failed command leaves none
    if any(f not in known for f in faults):
        raise UsageError(f"--plant-faults: unknown {[f for f in faults if f not in known]}; known: "
                         f"{', '.join(known) or f'none for {problem.family}'}")
    if not args.simulate:
        gpus.can_search(args.gpu)  # before the storage is opened: a search that cannot run writes nothing
        # its workers start now, while Optuna is imported and the study read (logged as LiveEvaluator logs them)
        paths.studies_dir().mkdir(parents=True, exist_ok=True)
        devices, log = gpus.device_indices(args.devices), paths.worker_log()
        for i in devices:
            worker.spawn_ahead(i, str(log) if len(devices) == 1 else f"{log}.{i}", worker.warm_job(problem, args.objective))
    cfg = search.SearchConfig(
        gpu=args.gpu, problem=problem, trials=args.trials, timeout=args.timeout, sampler=args.sampler,
        storage=args.storage, study=args.study, objective=args.objective, simulate=args.simulate,
        simulate_delay=args.simulate_delay,
        import_records=args.import_records,
        plant_faults=faults,
        arch=args.arch, jobs=args.jobs, batch=args.ask_batch, top_k=args.top_k, eval_timeout=args.eval_timeout,
        seed=args.seed, warm_start=not args.no_warm_start, progress=not args.quiet, prune=args.prune or None, devices=args.devices)
    if captured:
        try:
            return cli_problems.search(cfg, captured, args, started)
        finally:
            worker.discard_ahead()
    importing = _import_meanwhile("pandas")  # the tables after the search (0.2-0.4 s), while it waits on its GPU
    try:
        report = search.run(cfg)
    finally:
        worker.discard_ahead()
        importing.join()
    st = study.load(report.study_name, args.storage)
    print(_show(st, args.top_k))
    total = report.compile_s + report.verify_s + report.time_s
    share = (lambda x: f"{100 * x / total:.0f}%") if total else (lambda x: "-")
    rate = 60 * report.trials / report.wall_s if report.wall_s else 0.0
    since_start = time.monotonic() - started
    variants = report.evaluated + report.failed.get("compile error", 0)
    if cfg.simulate:  # nothing compiled or ran: the times are the recording's, the wall time the replay's
        print(f"\nthis run: {variants} variants replayed from {cfg.simulate} ({report.pruned} pruned, "
              f"{sum(report.failed.values())} failed) in {since_start:.1f} s from the command's start")
    else:
        print(f"\nthis run: {variants} variants compiled, verified and timed or pruned ({report.pruned} pruned, "
              f"{sum(report.failed.values())} failed) in {since_start:.1f} s from the command's start: "
              f"{60 * variants / since_start:.0f} variants/min")
    print(f"{report.trials} trials in {report.wall_s:.1f} s of search ({rate:.0f}/min), "
          f"{report.evaluated} {'replayed' if cfg.simulate else 'evaluated'}, "
          + ("" if cfg.simulate else f"{report.compiled} compiled, ") +
          f"{report.duplicates} duplicates, "
          f"failures {report.failed or 'none'}, worker restarts {report.worker_restarts} "
          f"({report.worker_kills} killed from outside, their variants run again), "
          f"re-queued after a kill {len(report.requeued)}, imported {report.imported}, "
          f"warm-started {report.warm_started}")
    if cfg.simulate:
        print(f"recorded time of these variants on the GPU: verify {report.verify_s:.1f} s, "
              f"timing {report.time_s:.1f} s (compiles not replayed)")
    else:
        print(f"time: compile {report.compile_s:.1f} s ({share(report.compile_s)}), verify {report.verify_s:.1f} s "
              f"({share(report.verify_s)}), timing {report.time_s:.1f} s ({share(report.time_s)})")
    if not cfg.simulate and report.spans:
        print(report.pipeline(started))
    print(f"measurements: {report.records_path}")
    return 0


def _family_of(argv: list[str] | None) -> str:
    """--family, read ahead: the other options of a command depend on it."""
    from tuner import families

    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    pre.add_argument("--family", default=families.DEFAULT)
    try:
        name = pre.parse_known_args(argv)[0].family
    except argparse.ArgumentError:  # `--family` without a name: the full parser says so
        return families.DEFAULT
    return name if name in families.names() else families.DEFAULT  # an unknown one: argparse says so


def parser(family: str | None = None) -> argparse.ArgumentParser:
    from tuner import families

    fam = cli_target.cli_part(family or families.DEFAULT)
    p = cli_args.Parser(prog="tuner", description="Tune CUDA kernel variants of PyTorch ops.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.commands = p.add_subparsers(dest="command", required=True)
    target, gpu_only, family_opt = _target_parser(), _target_parser(arch=False), _family_parser()
    dtypes = argparse.ArgumentParser(add_help=False)
    cli_target.add_space_args(dtypes, family or families.DEFAULT)

    s = sub.add_parser("variants", parents=[family_opt, target, dtypes], help="list the valid variants")
    s.add_argument("--json", action="store_true")
    s.add_argument("--limit", type=cli_args.count_or_zero, default=40, help="rows to print (0: all)")

    s = sub.add_parser("build", parents=[family_opt, target, dtypes], help="compile variants (no GPU needed)")
    s.add_argument("--limit", type=cli_args.count, help="build this many variants, spread over the space")
    s.add_argument("--jobs", type=cli_args.jobs, help="parallel compiles (default: all cores)")
    s.add_argument("--covering", action="store_true",
                   help="the covering set: every value of every dimension, every dtype pair")
    s.add_argument("--json", action="store_true")
    problem = argparse.ArgumentParser(add_help=False)
    cli_target.add_problem_args(problem, family or families.DEFAULT)
    study_opts = _study_parser()
    s = sub.add_parser("search", parents=[family_opt, target, problem, study_opts],
                       help="search for the fastest correct variant")
    # a family whose calls take milliseconds says fewer (its SEARCH_TRIALS: linear cross-entropy's)
    trials = getattr(families.get(family or families.DEFAULT), "SEARCH_TRIALS", 200)
    s.add_argument("--trials", type=cli_args.count, default=trials,
                   help=f"finished trials the study should reach (with --problems or --dtypes: per problem on average; "
                        f"a family's default problems each their share; default {trials})")
    s.add_argument("--problems", type=Path, metavar="FILE",
                   help="search every problem a capture recorded (tuner.capture), one study each, trials split "
                        "by their share of the captured time; the problem options are ignored")
    cli_target.add_search_dtypes(family or families.DEFAULT, s)
    s.add_argument("--timeout", type=cli_args.seconds, help="stop asking for new trials after this many seconds")
    s.add_argument("--sampler", default="ranked", choices=SAMPLERS,
                   help="ranked (default): unseen variants a model of the study ranks best, in batches, the "
                        "family's other studies' best first; tpe: Optuna's TPE; random; grid (every variant)")
    s.add_argument("--no-warm-start", action="store_true",
                   help="ranked: ignore the family's other studies in the storage")
    s.add_argument("--simulate", type=Path, metavar="FILE",
                   help="replay recorded measurements (a search's .jsonl) instead of using a GPU")
    s.add_argument("--simulate-delay", type=cli_args.delay, default=0.0, help=argparse.SUPPRESS)
    s.add_argument("--jobs", type=cli_args.jobs, help="parallel compiles (default: all cores)")
    s.add_argument("--ask-batch", type=cli_args.count, help="trials asked of Optuna and compiled together")
    s.add_argument("--top-k", type=cli_args.count, default=8, help="finalists re-timed at the end (default 8)")
    s.add_argument("--eval-timeout", type=cli_args.seconds, default=60.0,
                   help="seconds before a variant counts as hung")
    s.add_argument("--devices", metavar="all|0,1,...", type=cli_args.devices,
                   help="GPUs of this host that evaluate variants, a worker each, fed from one study and one "
                        "compile pipeline (default: device 0); all must be the --gpu model")
    s.add_argument("--prune", type=cli_args.prune_factor, default=1.5, metavar="FACTOR",
                   help="stop timing a verified variant whose first repetitions are FACTOR x slower than the "
                        "best so far (recorded as PRUNED); 0 times every variant in full")
    s.add_argument("--seed", type=cli_args.seed, default=0,
                   help="the sampler's seed (0 to 2**32 - 1; default 0: the same command tries the same "
                        "variants, whose builds a later search finds done; another seed explores others)")
    s.add_argument("--import-records", type=Path, metavar="FILE",
                   help="count the measurements in FILE (same GPU, problem and objective) as finished trials")
    s.add_argument("--plant-faults", metavar="KINDS",
                   help="test only: also evaluate variants with planted faults, e.g. oob,assert,hang "
                        "(compile, oob, assert, hang, wrong, nan, resources)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")

    problem = [family_opt, gpu_only, problem, study_opts]
    s = sub.add_parser("show", parents=problem, help="print a stored study, or an export")
    s.add_argument("--json", action="store_true")
    s.add_argument("--export", type=Path, metavar="DIR",
                   help="an exported folder instead (or its name under $TUNER_HOME/exports, as `tuner list` shows "
                        "it): its problems and what serves each, the shapes measured around them, and what serves "
                        "each dtype pair elsewhere")
    s.add_argument("--top-k", type=cli_args.count, default=10, help="variants to list (default 10)")

    s = sub.add_parser("export-best", parents=[family_opt, gpu_only], help="export the winners of a GPU's studies")
    s.add_argument("--study", type=cli_args.study_name, help="export this study only")
    s.add_argument("--out", type=cli_args.folder, help="artifact folder (default: exports/<family>-<GPU> under $TUNER_HOME)")
    s.add_argument("--storage", type=cli_args.name, help=STORAGE_HELP)
    s.add_argument("--wheel", type=cli_args.folder, metavar="DIR",
                   help="also write a pip-installable wheel of the export into DIR (needs torch alone)")
    s.add_argument("--sources-only", action="store_true",
                   help="write sources only, no binaries (loading then builds them)")
    s.add_argument("--no-check", action="store_true",
                   help="skip timing the op against torch's at its problems (on the export's GPU), which gives "
                        "torch's op every problem where the op is slower in wall or GPU time (where the family has a "
                        "bench of its problems; export-best says when it has none)")

    s = sub.add_parser("bench", parents=[family_opt, gpu_only], help="time the tuned op against what users run today")
    s.add_argument("--artifact", type=Path, help="exported folder (default: the attached GPU's export)")
    fam.add_bench_args(s)
    s.add_argument("--problems", type=Path, metavar="FILE",
                   help="shapes from tuner.capture: the tuned op against torch's op alone at each captured problem "
                        "of the family, instead of the default configurations")
    s.add_argument("--out", type=cli_args.folder, help="folder (default: bench-results under $TUNER_HOME)")

    s = sub.add_parser("report", parents=problem, help="CSV, importances and plots of a study")
    s.add_argument("--out", type=cli_args.folder, help="folder (default: reports/<study> under $TUNER_HOME)")

    sizes = argparse.ArgumentParser(add_help=False)
    cli_target.add_problem_args(sizes, family or families.DEFAULT)
    s = sub.add_parser("samplers", parents=[family_opt, sizes],
                       help="search quality in simulation: trials each sampler needs to find a near-best variant")
    s.add_argument("--simulate", type=Path, metavar="FILE", required=True,
                   help="a recording of the whole space (a search's .jsonl)")
    s.add_argument("--samplers", default=",".join(SAMPLERS), help="comma-separated (default: all)")
    s.add_argument("--seeds", type=cli_args.integer(1, 100_000), default=20, help="runs per sampler (default 20)")
    s.add_argument("--first-seed", type=cli_args.seed, default=0, help="seeds run from this one up (default 0)")
    s.add_argument("--within", type=cli_args.fraction, default=0.03,
                   help="a run ends at a variant within this fraction of the recording's best (default 0.03)")
    s.add_argument("--max-trials", type=cli_args.count,
                   help="give up after this many trials (default: the size of the space)")
    s.add_argument("--objective", default="fwd+bwd", choices=("fwd", "bwd", "fwd+bwd"))
    s.add_argument("--csv", type=Path, help="also write the table here")
    s.add_argument("--jobs", type=cli_args.jobs, help="runs at once, a process each (default: all cores)")
    s.add_argument("--fail-above", type=cli_args.percent, metavar="PCT",
                   help="exit 1 when the default sampler's (ranked) median is above PCT %% of the space")

    s = sub.add_parser("list", help="list stored studies and exports")
    s.add_argument("--storage", type=cli_args.name, help=STORAGE_HELP)

    s = sub.add_parser("dashboard", help="Optuna's dashboard on a storage (pip install optuna-dashboard)")
    s.add_argument("--storage", type=cli_args.name, help=STORAGE_HELP)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=cli_args.port, default=8080)
    for s in sub.choices.values():  # --debug after the command too
        s.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    return p


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command itself, not a caller's process
        paths.keep_bytecode()
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # not where the caller chose otherwise
            signal.signal(signal.SIGTERM, ending.terminated)
    command, argv = argv is None, sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            code = _run(argv)
        finally:
            if sys.stdout is not None:  # None: started with stdout closed (`>&-`), and print() writes nothing
                sys.stdout.flush()  # here rather than at exit, so that a closed pipe is caught below
    except BrokenPipeError:
        # The reader went away (`tuner variants | head -1`). As Python's docs advise (signal, "Note
        # on SIGPIPE"): stdout to devnull, so the interpreter's last flush does not fail again.
        with contextlib.suppress(OSError, ValueError):  # ValueError: a stdout without a descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return ending.leave(code) if command else code


def _run(argv: list[str]) -> int:
    p = parser(_family_of(argv))
    args = p.parse_args(argv)
    args.options = cli_args.given_options(p, args.command, argv)  # what the user gave
    try:
        with _one_line_warnings(args.command):
            return COMMANDS[args.command](args)
    except KeyboardInterrupt as stop:
        how = "terminated (SIGTERM)" if isinstance(stop, ending.Terminated) else "interrupted"
        kept = ("; its finished trials are kept, and the same command goes on from them"
                if args.command == "search" else "")
        print(f"tuner {args.command}: {how}{kept}", file=sys.stderr)
        return 128 + signal.SIGTERM if isinstance(stop, ending.Terminated) else 130
    except BrokenPipeError:
        raise
    except Exception as exc:
        if args.debug:
            raise
        print(f"tuner {args.command}: error: {_message(exc, args)}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1


def _message(exc: Exception, args: argparse.Namespace) -> str:
    """An error in one line: ours as it is, a file's by its path, a storage's by its URL; anything
    else is a bug, said with the way to its traceback."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if isinstance(exc, TunerError):
        return text
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename is not None else exc.strerror
    optuna = sys.modules.get("optuna")
    if (type(exc).__module__.split(".")[0] in ("sqlalchemy", "psycopg")
            or optuna is not None and isinstance(exc, optuna.exceptions.StorageInternalError)):
        from tuner.store import study

        url = study.shown(study.storage_url(getattr(args, "storage", None)))
        return f"storage {url}: {first or type(exc).__name__}"
    return (f"{type(exc).__name__}: {first} (unexpected: `tuner --debug {args.command} ...` "
            "shows where it came from)")


@contextlib.contextmanager
def _one_line_warnings(command: str):
    """Python warnings in one line each, without the source line that raised them (for this
    command only: the formatter is put back after it)."""
    saved = warnings.formatwarning
    warnings.formatwarning = lambda message, *_args, **_kwargs: f"tuner {command}: warning: {message}\n"
    try:
        yield
    finally:
        warnings.formatwarning = saved


if __name__ == "__main__":
    sys.exit(main())
