"""The EmbeddingBag family's command-line options."""

from __future__ import annotations

import argparse

from tuner.cli import args as cli_args
from tuner.families import embedding_bag as eb


def add_space_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weight", default="float32", help="weight dtype: float32 (default), float16, bfloat16")
    p.add_argument("--index", default="int64", help="indices/offsets dtype: int64 (default), int32")
    p.add_argument("--all-dtypes", action="store_true", help="every (weight, index) dtype pair")


def spaces(args) -> list:
    if args.all_dtypes:
        return eb.all_spaces()
    return [eb.space(args.weight, args.index)]


def add_problem_args(p: argparse.ArgumentParser) -> None:
    d = eb.Problem()
    p.add_argument("--rows", type=cli_args.size, default=d.rows, help=f"embedding rows (default {d.rows:,}, the PR's)")
    p.add_argument("--dim", type=cli_args.size, default=d.dim, help=f"embedding dim (default {d.dim})")
    p.add_argument("--bags", type=cli_args.size, default=d.bags, help=f"bags (default {d.bags})")
    p.add_argument("--bag-size", type=cli_args.size_or_zero, default=d.bag_size,
                   help=f"mean indices per bag (default {d.bag_size})")
    p.add_argument("--mode", default=d.mode, choices=eb.MODES)
    p.add_argument("--weight", default=d.weight, help="weight dtype (default float32)")
    p.add_argument("--index", default=d.index, help="index dtype (default int64)")
    p.add_argument("--ids", default=d.distribution, choices=eb.DISTRIBUTIONS,
                   help="index distribution: random (default), one_hot, multi_hot")


def problem(args) -> eb.Problem:
    eb.space(args.weight, args.index)  # checks the dtypes
    return eb.Problem(args.rows, args.dim, args.bags, args.bag_size, args.mode, eb.dtype_name(args.weight),
                      eb.dtype_name(args.index), args.ids)


def describe(problem: dict) -> str:
    return (f"{problem['weight']}/{problem['index']} {problem['rows']}x{problem['dim']} "
            f"bags={problem['bags']} L={problem['bag_size']} {problem['mode']} {problem['distribution']}")


def add_bench_args(p: argparse.ArgumentParser) -> None:
    pass


def bench(directory, args) -> list[dict]:
    from tuner.families.embedding_bag import bench as eb_bench

    return eb_bench.run(directory, out=args.out)


def bench_problems(directory, problems: list[dict], args) -> list[dict]:
    from tuner.families.embedding_bag import bench as eb_bench

    return eb_bench.run_problems(directory, problems, out=args.out)
