"""`tuner samplers`: search quality in simulation, each sampler's trials to a near-best variant."""

from __future__ import annotations

import argparse
import os
import sys
import time

from tuner.cli import args as cli_args
from tuner.cli import target as cli_target
from tuner.errors import TunerError, UsageError


def cmd_samplers(args: argparse.Namespace) -> int:
    from tuner import search
    from tuner.search import ranking

    ranking.one_blas_thread()  # before the simulations load numpy (tuner.search.quality)
    from tuner.search import quality

    names = [n for n in args.samplers.split(",") if n]
    unknown = [n for n in names if n not in search.SAMPLERS]
    if unknown or not names:
        raise UsageError(f"--samplers: unknown {unknown or 'none given'}; known: {', '.join(search.SAMPLERS)}")
    cli_args.recording(args.simulate, "--simulate")
    if args.fail_above is not None and search.SearchConfig.sampler not in names:
        raise UsageError(f"--fail-above judges the default sampler, {search.SearchConfig.sampler}: add it to --samplers")
    if args.first_seed + args.seeds > 2**32:
        raise UsageError(f"--first-seed {args.first_seed} --seeds {args.seeds}: seeds go up to 2**32 - 1")
    if args.csv is not None and (args.csv.is_dir() or not args.csv.parent.is_dir()):
        raise TunerError(f"--csv {args.csv}: " + ("a folder" if args.csv.is_dir() else
                                                   f"{args.csv.parent} is a file" if args.csv.parent.exists() else
                                                   "its folder does not exist"))
    problem = cli_target.problem(args)
    best = quality.dataset_best(args.simulate, problem, args.objective)
    size = quality.space_size(problem)
    print(f"{args.simulate}: best {args.objective} {best:.2f} us; a run reaches at <= {best * (1 + args.within):.2f} us "
          f"(within {args.within:.0%}); {size} variants", file=sys.stderr)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started = time.monotonic()
    table = quality.sampler_table(
        args.simulate, problem, names, seeds, args.within, args.max_trials, args.objective,
        on_run=lambda name, seed, count: print(f"  {name} seed {seed}: {count or 'not reached'}", file=sys.stderr),
        jobs=args.jobs or os.cpu_count() or 1)
    print(quality.markdown(table), end="")
    print(f"wall {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.csv:
        table.to_csv(args.csv, index=False)
    default = search.SearchConfig.sampler
    if args.fail_above is not None:
        share = table.loc[table["sampler"] == default, "median % of space"].iloc[0]
        if not share <= args.fail_above:  # NaN (not reached) fails too
            print(f"tuner samplers: {default}'s median is {share}% of the space, above {args.fail_above}%",
                  file=sys.stderr)
            return 1
    return 0
