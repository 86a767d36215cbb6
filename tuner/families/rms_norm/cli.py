"""RMSNorm's command line beyond what its declarations give (tuner.cli.target): how an
export's problem reads in a line, and `tuner bench`'s options."""

from __future__ import annotations

import argparse

from tuner.cli import args as cli_args
from tuner.families import rms_norm


def describe(problem: dict) -> str:
    return f"{problem['x']}/{problem['weight']} {problem['rows']}x{problem['width']}"


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", type=cli_args.shapes, default=((4096, 4096), (8192, 8192), (16384, 4096)),
                   help="ROWSxWIDTH, comma-separated (default 4096x4096,8192x8192,16384x4096)")
    p.add_argument("--dtype", default="bfloat16", help="x and weight dtype (default bfloat16)")


def bench(directory, args) -> list[dict]:
    from tuner.families.rms_norm import bench as rms_bench

    return rms_bench.run(directory, list(args.shapes), rms_norm.dtype_name(args.dtype), out=args.out)


def bench_problems(directory, problems: list[dict], args) -> list[dict]:
    from tuner.families.rms_norm import bench as rms_bench

    return rms_bench.run_problems(directory, problems, out=args.out)
