"""The EmbeddingBag family's command-line options: which spaces `variants`/`build` list, how an
export's problem reads in a line, and `tuner bench`'s (the problem's are its Problem's declared
fields)."""

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
