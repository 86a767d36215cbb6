"""EmbeddingBag's command line beyond what its declarations give (tuner.cli.target): how an
export's problem reads in a line, and `tuner bench`'s options."""

from __future__ import annotations

import argparse



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
