"""GIoU's command line beyond what the core makes of its declaration and fields (tuner.cli.target:
the space options, SPACE_FLAGS included, and the problem's): how an export's problem reads in a
line, and `tuner bench`'s options."""

from __future__ import annotations

import argparse

from tuner.cli import args as cli_args


def describe(problem: dict) -> str:
    """A tuned problem in one line (export-best's listing)."""
    return f"{problem['pred']}/{problem['target']} B={problem['batch']} S={problem['slots']}"


def add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batches", type=cli_args.sizes, default=(64, 256, 1024, 4096),
                   help="batch sizes, comma-separated (default 64,256,1024,4096)")
    p.add_argument("--dtypes", type=cli_args.pairs, default=(("bfloat16", "uint8"), ("float32", "float32")),
                   help="pred/target pairs, comma-separated (default bfloat16/uint8,float32/float32)")


def bench(directory, args) -> list[dict]:
    import tuner
    from tuner.families.giou import bench as giou_bench

    op = tuner.load(directory)
    return giou_bench.run(op, args.batches, args.dtypes, out=args.out)
