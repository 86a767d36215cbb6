"""scale_add's command-line options: one problem size, nothing else to choose."""

from __future__ import annotations

import argparse

from tuner.errors import TunerError

from . import Problem, space


def add_space_args(p: argparse.ArgumentParser) -> None:
    pass


def spaces(args) -> list:
    return [space()]


def add_problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=1 << 20, help="vector length")


def problem(args) -> Problem:
    if args.n < 1:
        raise TunerError("--n must be positive")
    return Problem(args.n)


def describe(problem: dict) -> str:
    return f"n={problem['n']}"


def add_bench_args(p: argparse.ArgumentParser) -> None:
    pass


def bench(directory, args) -> list[dict]:
    raise TunerError("scale_add has no benchmark")
