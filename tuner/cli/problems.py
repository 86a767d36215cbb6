"""`tuner search --problems FILE`: every problem a capture recorded, searched in one command
(tuner.search.problems), with a line per problem as it starts and a table at the end: each
problem's winner beside torch's op, and which of the two the export will serve it with. `tuner
search --dtypes ...`: the problems of those dtypes, the same way, each an even share. A family's
`DEFAULT_PROBLEMS`: what a search that names no problem tunes, the same way, each its share of --trials."""

from __future__ import annotations

import time
from pathlib import Path

from tuner.search.config import SearchConfig


def named(args) -> list[tuple[object, float]] | None:
    """The problems a search's options name, with their shares: a capture's (`--problems FILE`), or
    one per dtype tuple (`--dtypes`, even shares); None where they name one problem."""
    import dataclasses

    from tuner import families
    from tuner.cli import target
    from tuner.errors import UsageError
    from tuner.space import dtype_fields

    dtyped = getattr(args, "dtypes", None) is not None
    if args.problems is not None and dtyped:
        raise UsageError("--problems and --dtypes each name the problems to search: drop one")
    if args.study and (args.problems is not None or dtyped):
        raise UsageError(f"{'--problems' if args.problems is not None else '--dtypes'} searches one study per "
                         "problem, named after it: drop --study")
    if args.problems is not None:
        return read(args.problems, args.family if "--family" in args.options else None)
    fam = families.get(args.family)
    if not dtyped:
        return defaults(fam, args)
    fields = set(dtype_fields(fam))
    flags = {target.option_flag(f) for f in dataclasses.fields(fam.Problem) if f.name in fields and "option" in f.metadata}
    given = sorted(flags & args.options)
    if given:
        raise UsageError(f"--dtypes names each problem's dtypes: drop {', '.join(given)}")
    problems = target.dtype_problems(args)
    return [(p, 1 / len(problems)) for p in problems]


def defaults(fam, args) -> list[tuple[object, float]] | None:
    """The family's default problems (`DEFAULT_PROBLEMS`: (a change of its Problem's defaults, the
    share of --trials it gets) each), where the command names no problem: no problem option, no --study, no
    recording to replay or import (those are one study's); None otherwise, or where the family has one."""
    import dataclasses

    from tuner.cli import target

    changes = getattr(fam, "DEFAULT_PROBLEMS", ())
    flags = {target.option_flag(f) for f in dataclasses.fields(fam.Problem) if "option" in f.metadata}
    if len(changes) < 2 or flags & args.options or args.study or args.simulate or args.import_records:
        return None
    return [(fam.Problem(**change), share) for change, share in changes]


def read(path: Path, family: str | None) -> list[tuple[object, float]]:
    """(a family's Problem, its share of the captured time) per captured problem, of `family`
    if given, largest share first."""
    from tuner import families
    from tuner.deploy import captured

    return [(families.get(r["family"]).Problem(**r["problem"]), r["share"]) for r in captured.read(path, family)]


def _describe(problem) -> str:
    from tuner.cli import target

    return f"{problem.family} {target.cli_part(problem.family).describe(problem.__dict__)}"


def search(base: SearchConfig, captured: list[tuple[object, float]], args, started: float) -> int:
    import dataclasses

    from tuner.store import study
    from tuner.store.records import objective_value, served_by
    from tuner.search import problems

    shares = [share for _, share in captured]
    if source_is_defaults := args.problems is None and getattr(args, "dtypes", None) is None:
        # each its share of --trials, however few (a quick `--trials 12`: 12 and 4, not the floor's 64)
        cfgs = [dataclasses.replace(base, problem=p, trials=max(1, round(base.trials * share)), study=None)
                for p, share in captured]
    else:
        cfgs = problems.configs(base, [p for p, _ in captured], shares)

    source = (args.problems if args.problems is not None else "the family's defaults" if source_is_defaults
              else "--dtypes")
    share_of = "the captured time" if args.problems is not None else "the trials"

    def on_start(i: int, cfg: SearchConfig) -> None:
        print(f"[{i + 1}/{len(cfgs)}] {_describe(cfg.problem)}: {shares[i]:.0%} of {share_of}, "
              f"{cfg.trials} trials ({time.monotonic() - started:.0f} s from the command's start)", flush=True)

    def on_end(i: int, report) -> None:
        compiled = f", compiling {report.compile_s:.0f} s" if not base.simulate else ""
        print(f"      {report.trials} trials in {report.wall_s:.1f} s{compiled}: study {report.study_name}",
              flush=True)

    reports = problems.run(cfgs, on_start, on_end)
    print(f"\n{len(cfgs)} problems from {source}:")
    served = 0
    for cfg, report in zip(cfgs, reports):
        st = study.load(report.study_name, args.storage)
        winner, baseline = st.user_attrs.get("winner"), st.user_attrs.get("baseline")
        if not winner:
            print(f"  {_describe(cfg.problem)}: no verified variant")
            continue
        line = (f"  {_describe(cfg.problem)}: {report.trials} trials ({report.warm_started} warm-started from "
                f"the others' best), {winner['variant']} {winner['objective_us']:.2f} us")
        if baseline:
            who = served_by(winner, baseline, cfg.objective)
            served += who == "variant"
            line += (f", torch {objective_value(baseline, cfg.objective):.2f} us: "
                     + ("the winner serves it" if who == "variant" else "torch's op serves it"))
        print(line)
    trials = sum(r.trials for r in reports)
    wall = time.monotonic() - started
    print(f"{trials} trials in {wall:.1f} s from the command's start ({60 * trials / wall:.0f}/min); "
          f"variants serve {served} of {len(cfgs)} problems; `tuner export-best` binds them all")
    return 0
