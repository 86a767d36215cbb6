"""The RMSNorm family's command-line options."""

from __future__ import annotations

import argparse

from tuner.errors import TunerError
from tuner.families import rms_norm


def add_space_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--x", default="bfloat16", help="x dtype: float32, float16, bfloat16 (default)")
    p.add_argument("--weight", default="bfloat16", help="weight dtype: float32, float16, bfloat16 (default)")
    p.add_argument("--all-dtypes", action="store_true", help="every (x, weight) dtype pair")


def spaces(args) -> list:
    return rms_norm.all_spaces() if args.all_dtypes else [rms_norm.space(args.x, args.weight)]


def add_problem_args(p: argparse.ArgumentParser) -> None:
    d = rms_norm.Problem()
    p.add_argument("--rows", type=int, default=d.rows, help=f"rows: x's leading dimensions multiplied (default {d.rows})")
    p.add_argument("--width", type=int, default=d.width, help=f"the normalized (last) dimension (default {d.width})")
    p.add_argument("--x", default=d.x, help="x dtype (default bfloat16)")
    p.add_argument("--weight", default=d.weight, help="weight dtype (default bfloat16)")


def problem(args) -> rms_norm.Problem:
    if args.rows < 1 or args.width < 1:
        raise TunerError("--rows and --width must be positive")
    rms_norm.space(args.x, args.weight)  # checks the dtypes
    return rms_norm.Problem(args.rows, args.width, rms_norm.dtype_name(args.x), rms_norm.dtype_name(args.weight))


def describe(problem: dict) -> str:
    return f"{problem['x']}/{problem['weight']} {problem['rows']}x{problem['width']}"


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default="4096x4096,8192x8192,16384x4096", help="rows x width, comma-separated")
    p.add_argument("--dtype", default="bfloat16", help="x and weight dtype (default bfloat16)")


def bench(directory, args) -> list[dict]:
    from tuner.families.rms_norm import bench as rms_bench

    shapes = []
    for s in args.shapes.split(","):
        try:
            rows, width = (int(n) for n in s.lower().split("x"))
        except ValueError:
            raise TunerError(f"--shapes: {s!r} is not ROWSxWIDTH") from None
        shapes.append((rows, width))
    return rms_bench.run(directory, shapes, rms_norm.dtype_name(args.dtype), out=args.out)
